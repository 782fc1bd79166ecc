/* The accelerator decision, against a fake QEMU whose firmware answers on the debug console
 * (or aborts, or dawdles) as each kind of host's would, and a fake KVM device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <glib/gstdio.h>
#include <string.h>

#include "hostd-accel.h"

/* A shell stand-in for QEMU: what it does under KVM with "-cpu host", under KVM with the host
 * CPU less arch-capabilities, and under TCG. "ok" prints SeaBIOS's boot line at once, "abort"
 * dies as QEMU does on an MSR it cannot set, "slow" prints it after 2 s. */
typedef struct {
    const char *name;
    HostdAccelMode mode;
    gboolean have_kvm;
    const char *kvm_host, *kvm_no_arch, *tcg;
    const char *virt_type;
    const char *cpu_disable; /* comma-separated, "" for none */
    const char *summary;     /* a substring of the summary */
} Case;

static const Case cases[] = {
    {"KVM works", HOSTD_ACCEL_AUTO, TRUE, "ok", "ok", "ok", "kvm", "", "KVM (/dev/kvm), host CPU"},
    {"nested KVM without arch-capabilities", HOSTD_ACCEL_AUTO, TRUE, "abort", "ok", "ok", "kvm",
     "arch-capabilities", "without arch-capabilities"},
    {"KVM slower than TCG", HOSTD_ACCEL_AUTO, TRUE, "abort", "slow", "ok", "qemu", "",
     "slower than TCG"},
    {"KVM that cannot start a guest", HOSTD_ACCEL_AUTO, TRUE, "abort", "abort", "ok", "qemu", "",
     "cannot start a guest"},
    {"no KVM device", HOSTD_ACCEL_AUTO, FALSE, "ok", "ok", "ok", "qemu", "", "no usable /dev/kvm"},
    {"tcg asked for", HOSTD_ACCEL_TCG, TRUE, "ok", "ok", "ok", "qemu", "", "accel = tcg"},
    {"kvm asked for, though slow", HOSTD_ACCEL_KVM, TRUE, "ok", "ok", "slow", "kvm", "",
     "host CPU"},
};

static char *
write_fake_qemu(const char *dir, const Case *c)
{
    g_autofree char *path = g_build_filename(dir, "qemu", NULL);
    g_autofree char *script =
        g_strdup_printf("#!/bin/sh\n"
                        "act() { case $1 in\n"
                        "  ok) echo 'Booting from Hard Disk...' ;;\n"
                        "  slow) sleep 2; echo 'Booting from Hard Disk...' ;;\n"
                        "  abort) kill -ABRT $$ ;;\n"
                        "esac; exec sleep 30; }\n"
                        "case \" $* \" in\n"
                        "  *' tcg '*) act %s ;;\n"
                        "  *' host,-arch-capabilities '*) act %s ;;\n"
                        "  *' host '*) act %s ;;\n"
                        "esac\n"
                        "exit 1\n",
                        c->tcg, c->kvm_no_arch, c->kvm_host);
    g_assert_true(g_file_set_contents(path, script, -1, NULL));
    g_assert_cmpint(g_chmod(path, 0755), ==, 0);
    return g_steal_pointer(&path);
}

static void
test_decisions(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const Case *c = &cases[i];
        g_autofree char *dir = g_dir_make_tmp("test-accel-XXXXXX", NULL);
        g_autofree char *qemu = write_fake_qemu(dir, c);
        g_autofree char *kvm = g_build_filename(dir, c->have_kvm ? "kvm" : "absent", NULL);
        if (c->have_kvm)
            g_assert_true(g_file_set_contents(kvm, "", 0, NULL));

        gint64 start = g_get_monotonic_time();
        g_autoptr(HostdAccel) accel = hostd_accel_detect(c->mode, qemu, kvm);
        gint64 took_ms = (g_get_monotonic_time() - start) / 1000;
        g_autofree char *disabled = g_strjoinv(",", accel->cpu_disable);

        if (!g_str_equal(accel->virt_type, c->virt_type) ||
            !g_str_equal(disabled, c->cpu_disable) || strstr(accel->summary, c->summary) == NULL)
            fail_msg("%s: got %s, disable '%s', '%s'", c->name, accel->virt_type, disabled,
                     accel->summary);
        /* A QEMU that never answers must not hold hostd's start for long. */
        if (took_ms > 5000)
            fail_msg("%s: the decision took %" G_GINT64_FORMAT " ms", c->name, took_ms);
        g_unlink(qemu);
        g_unlink(kvm);
        g_rmdir(dir);
    }
}

static void
test_mode_parse(void **state)
{
    HostdAccelMode mode = HOSTD_ACCEL_TCG;
    assert_true(hostd_accel_mode_parse("auto", &mode));
    assert_int_equal(mode, HOSTD_ACCEL_AUTO);
    assert_true(hostd_accel_mode_parse("kvm", &mode));
    assert_int_equal(mode, HOSTD_ACCEL_KVM);
    assert_true(hostd_accel_mode_parse("tcg", &mode));
    assert_int_equal(mode, HOSTD_ACCEL_TCG);
    assert_false(hostd_accel_mode_parse("KVM", &mode));
    assert_false(hostd_accel_mode_parse("", &mode));
    assert_int_equal(mode, HOSTD_ACCEL_TCG);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decisions),
        cmocka_unit_test(test_mode_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
