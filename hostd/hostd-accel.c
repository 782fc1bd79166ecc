#include "hostd-accel.h"

#include <gio/gio.h>
#include <gio/gunixinputstream.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

/* What a firmware start gave: its time, or why there is none. */
#define FIRMWARE_DIED     (-1)
#define FIRMWARE_TOO_SLOW (-2)

/* Milliseconds @qemu's firmware (SeaBIOS, on the debug console) takes from QEMU's start to its
 * first boot attempt, on a diskless q35 machine under @accel (and "-cpu @cpu" when not NULL);
 * FIRMWARE_DIED when QEMU exits first (a KVM that cannot take the CPU model aborts it),
 * FIRMWARE_TOO_SLOW when @limit_ms passes first. QEMU is killed either way. */
static gint64
hostd_accel_firmware_ms(const char *qemu, const char *accel, const char *cpu, gint64 limit_ms)
{
    g_autoptr(GPtrArray) argv = g_ptr_array_new();
    const char *fixed[] = {qemu,
                           "-accel",
                           accel,
                           "-machine",
                           "q35",
                           "-m",
                           "64",
                           "-nodefaults",
                           "-display",
                           "none",
                           "-no-user-config",
                           "-chardev",
                           "stdio,id=dbg",
                           "-device",
                           "isa-debugcon,iobase=0x402,chardev=dbg",
                           "-boot",
                           "menu=off"};
    for (gsize i = 0; i < G_N_ELEMENTS(fixed); i++)
        g_ptr_array_add(argv, (gpointer)fixed[i]);
    if (cpu != NULL) {
        g_ptr_array_add(argv, (gpointer) "-cpu");
        g_ptr_array_add(argv, (gpointer)cpu);
    }
    g_ptr_array_add(argv, NULL);

    /* Not vm_spawn_run(): QEMU never exits by itself here; its debug console is read while it
     * runs, and it is killed once the firmware's line shows. */
    gint64 start = g_get_monotonic_time();
    g_autoptr(GSubprocess) proc =
        g_subprocess_newv((const char *const *)argv->pdata,
                          G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                              G_SUBPROCESS_FLAGS_STDERR_SILENCE,
                          NULL);
    if (proc == NULL)
        return FIRMWARE_DIED;
    int fd = g_unix_input_stream_get_fd(G_UNIX_INPUT_STREAM(g_subprocess_get_stdout_pipe(proc)));

    /* The tail of what was read, so a message split across reads is still seen. */
    char seen[256] = "";
    gint64 result = FIRMWARE_TOO_SLOW;
    for (;;) {
        gint64 left_ms = limit_ms - (g_get_monotonic_time() - start) / 1000;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left_ms <= 0 || poll(&pfd, 1, (int)left_ms) == 0)
            break;
        size_t used = strlen(seen);
        ssize_t n = read(fd, seen + used, sizeof seen - 1 - used);
        if (n <= 0) {
            result = FIRMWARE_DIED;
            break;
        }
        seen[used + (size_t)n] = '\0';
        if (strstr(seen, "Booting from") != NULL || strstr(seen, "No bootable") != NULL) {
            result = (g_get_monotonic_time() - start) / 1000;
            break;
        }
        size_t len = strlen(seen);
        if (len > 64)
            memmove(seen, seen + len - 64, 65);
    }
    g_subprocess_force_exit(proc);
    g_subprocess_wait(proc, NULL, NULL);
    return result;
}

static HostdAccel *
hostd_accel_new(const char *virt_type, const char *cpu_disable, char *summary)
{
    HostdAccel *accel = g_new0(HostdAccel, 1);
    accel->virt_type = g_strdup(virt_type);
    accel->cpu_disable = cpu_disable != NULL ? g_strsplit(cpu_disable, ",", -1) : g_new0(char *, 1);
    accel->summary = summary;
    return accel;
}

HostdAccel *
hostd_accel_detect(HostdAccelMode mode, const char *qemu, const char *kvm_device)
{
    if (mode == HOSTD_ACCEL_TCG)
        return hostd_accel_new("qemu", NULL,
                               g_strdup("TCG software emulation (accel = tcg); guests run slower"));
    g_autofree char *found = qemu == NULL ? g_find_program_in_path("qemu-system-x86_64") : NULL;
    const char *binary = qemu != NULL ? qemu : found;
    /* Checking access is what QEMU itself will need; the domain capabilities would list kvm
     * on hosts where the device exists but this user cannot open it. */
    if (access(kvm_device != NULL ? kvm_device : "/dev/kvm", R_OK | W_OK) != 0 || binary == NULL)
        return hostd_accel_new(
            "qemu", NULL,
            g_strdup("TCG software emulation (no usable /dev/kvm); guests run slower"));

    /* TCG's time bounds how long KVM may take: a KVM slower than emulation (some nested hosts)
     * is not worth having. Forced KVM still needs to know which CPU model starts. */
    gint64 tcg_ms = mode == HOSTD_ACCEL_AUTO ? hostd_accel_firmware_ms(binary, "tcg", NULL, 10000)
                                             : FIRMWARE_TOO_SLOW;
    gint64 limit_ms = tcg_ms >= 0 ? 3 * tcg_ms + 300 : 10000;
    const char *disable = NULL;
    gint64 kvm_ms = hostd_accel_firmware_ms(binary, "kvm", "host", limit_ms);
    if (kvm_ms == FIRMWARE_DIED) {
        disable = "arch-capabilities";
        kvm_ms = hostd_accel_firmware_ms(binary, "kvm", "host,-arch-capabilities", limit_ms);
    }
    if (kvm_ms >= 0) {
        const char *cpu =
            disable != NULL
                ? "host CPU without arch-capabilities (this host's KVM cannot set that MSR)"
                : "host CPU";
        return hostd_accel_new("kvm", disable, g_strdup_printf("KVM (/dev/kvm), %s", cpu));
    }
    if (mode == HOSTD_ACCEL_KVM)
        return hostd_accel_new("kvm", disable,
                               g_strdup("KVM (accel = kvm), though QEMU's firmware did not start "
                                        "under it within 10 s"));
    if (kvm_ms == FIRMWARE_DIED)
        return hostd_accel_new("qemu", NULL,
                               g_strdup("TCG software emulation (/dev/kvm is there but QEMU cannot "
                                        "start a guest with it); guests run slower"));
    return hostd_accel_new(
        "qemu", NULL,
        g_strdup_printf("TCG software emulation (/dev/kvm is there but runs guests slower than "
                        "TCG: firmware start over %" G_GINT64_FORMAT " ms vs %" G_GINT64_FORMAT
                        " ms)",
                        limit_ms, tcg_ms));
}

gboolean
hostd_accel_mode_parse(const char *text, HostdAccelMode *mode)
{
    static const char *const names[] = {"auto", "kvm", "tcg"};
    for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
        if (g_str_equal(text, names[i])) {
            *mode = (HostdAccelMode)i;
            return TRUE;
        }
    }
    return FALSE;
}

void
hostd_accel_free(HostdAccel *accel)
{
    if (accel == NULL)
        return;
    g_free(accel->virt_type);
    g_strfreev(accel->cpu_disable);
    g_free(accel->summary);
    g_free(accel);
}
