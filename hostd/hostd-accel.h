/* How guests run on this host: KVM with the host's CPU, KVM with the host's CPU less the
 * features a nested host's KVM cannot give, or TCG software emulation. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum {
    HOSTD_ACCEL_AUTO, /* KVM when it works and beats TCG, else TCG */
    HOSTD_ACCEL_KVM,  /* KVM whenever /dev/kvm can be opened */
    HOSTD_ACCEL_TCG,  /* always TCG */
} HostdAccelMode;

typedef struct {
    char *virt_type;    /* "kvm" or "qemu" (TCG) */
    char **cpu_disable; /* host CPU features hidden from KVM guests; empty, never NULL */
    char *summary;      /* one line for the log: which accelerator, and why */
} HostdAccel;

/* Decides how guests run, with @qemu (NULL: qemu-system-x86_64 from $PATH) and @kvm_device
 * (NULL: /dev/kvm). Without a KVM device this user can open, or with HOSTD_ACCEL_TCG, TCG.
 * Otherwise QEMU's firmware is started on a diskless machine under KVM with the host CPU (and, when
 * that QEMU dies, as it does on nested hosts whose KVM cannot set MSR_IA32_ARCH_CAPABILITIES, with
 * the host CPU less that feature); under HOSTD_ACCEL_AUTO the same firmware under TCG first sets
 * the bar: KVM that does not get there within 3x TCG's time (+300 ms) is slower than emulation
 * here, and TCG is used. Costs about 0.1-1 s. Never fails. */
HostdAccel *hostd_accel_detect(HostdAccelMode mode, const char *qemu, const char *kvm_device);

/* Parses "auto", "kvm" or "tcg" into @mode; FALSE for anything else. */
gboolean hostd_accel_mode_parse(const char *text, HostdAccelMode *mode);

void hostd_accel_free(HostdAccel *accel);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdAccel, hostd_accel_free)

G_END_DECLS
