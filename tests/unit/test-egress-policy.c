/* Egress policy: rule parsing, host normalisation, name and address decisions, persistence. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-policy.h"
#include "vm-error.h"
#include "test-common.h"
#include "test-egress-fixture.h"

#include <string.h>

static VmEgressAddress
addr(const char *text)
{
    VmEgressAddress address;

    if (!vm_egress_address_parse(text, &address, NULL))
        fail_msg("'%s' is not an address", text);
    return address;
}

/* ---------------------------------------------------------------------------------------------
 * Host normalisation */

static void
test_host_normalise_good(void **state)
{
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"pypi.org", "pypi.org"},
        {"PyPI.ORG", "pypi.org"},
        {"pypi.org.", "pypi.org"},
        {"localhost", "localhost"},
        {"xn--bcher-kva.example", "xn--bcher-kva.example"},
        {"a-b.c1.example", "a-b.c1.example"},
        {"1.example", "1.example"},
        {"203.0.113.7", "203.0.113.7"},
        {"2001:DB8::1", "2001:db8::1"},
        {"2001:db8:0:0:0:0:0:1", "2001:db8::1"},
        {"::ffff:127.0.0.1", "127.0.0.1"},
        {"::FFFF:7f00:1", "127.0.0.1"},
        {"::1", "::1"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *out = vm_egress_host_normalise(cases[i].in, &error);

        if (out == NULL)
            fail_msg("'%s' refused: %s", cases[i].in, error->message);
        assert_string_equal(out, cases[i].out);
    }
}

static void
test_host_normalise_bad(void **state)
{
    static const char *const cases[] = {
        "",
        ".",
        "pypi.org..",
        ".pypi.org",
        "a..b",
        "-a.example",
        "a-.example",
        "a_b.example",
        "b\xc3\xbc"
        "cher.example",
        "a b.example",
        "a\tb",
        "*.example.com",
        "example.com:443",
        "[::1]",
        "fe80::1%eth0",
        "fe80::1%25eth0",
        "2130706433",
        "0177.0.0.1",
        "0x7f000001",
        "0x7f.0.0.1",
        "127.1",
        "127.0.1",
        "127.0.0.01",
        "127.000.000.001",
        "1.2.3.4.5",
        "256.1.1.1",
        "example.0x10",
        "1:2:3",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *out = vm_egress_host_normalise(cases[i], &error);

        if (out != NULL)
            fail_msg("'%s' accepted as '%s'", cases[i], out);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
}

static void
test_host_too_long(void **state)
{
    g_autoptr(GString) name = g_string_new(NULL);
    g_autofree char *out = NULL;
    g_autofree char *longest = NULL;
    g_autoptr(GError) error = NULL;

    while (name->len < 250)
        g_string_append(name, "abcdefghi.");
    g_string_append(name, "com");
    longest = vm_egress_host_normalise(name->str, NULL);
    assert_non_null(longest);
    assert_int_equal(strlen(longest), 253);
    g_string_append(name, "x");
    out = vm_egress_host_normalise(name->str, &error);
    assert_null(out);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

/* ---------------------------------------------------------------------------------------------
 * Rules */

static void
test_rules_normalised(void **state)
{
    static const struct {
        const char *allow;
        const char *expect;
    } cases[] = {
        {NULL, "none"},
        {"none", "none"},
        {"NONE", "none"},
        {"any", "any"},
        {"PyPI.org.", "pypi.org"},
        {"*.GitHub.com", "*.github.com"},
        {"203.0.113.0/24", "203.0.113.0/24"},
        {"203.0.113.5", "203.0.113.5/32"},
        {"2001:DB8::/32", "2001:db8::/32"},
        {"::1", "::1/128"},
        {"0.0.0.0/0", "0.0.0.0/0"},
        {"a.example a.example b.example", "a.example b.example"},
        /* ports */
        {"PyPI.org.:443", "pypi.org:443"},
        {"*.GitHub.com:8443", "*.github.com:8443"},
        {"198.51.100.0/24:8443", "198.51.100.0/24:8443"},
        {"203.0.113.5:22", "203.0.113.5/32:22"},
        {"[2001:DB8::]/32:443", "[2001:db8::]/32:443"},
        {"[2001:db8:0::1]:443", "[2001:db8::1]/128:443"},
        {"[::ffff:203.0.113.5]:443", "203.0.113.5/32:443"},
        {"a.example a.example:443 a.example:443", "a.example a.example:443"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, NULL);
        g_auto(GStrv) allow = vm_egress_policy_dup_allow(policy);
        g_autofree char *joined = g_strjoinv(" ", allow);

        assert_string_equal(joined, cases[i].expect);
    }
}

static void
test_rules_bad(void **state)
{
    static const char *const cases[] = {
        "",
        " pypi.org",
        "pypi.org ",
        "*",
        "*.",
        "*.*.example",
        "a*.example",
        "foo.*.example",
        "**.example",
        "b\xc3\xbc"
        "cher.example",
        "203.0.113.0/33",
        "203.0.113.1/24",
        "203.0.113.0/",
        "203.0.113.0/024",
        "203.0.113.0/-1",
        "203.0.113.0/2a",
        "203.0.113/24",
        "0x7f000001",
        "2130706433",
        "127.1",
        "0177.0.0.1",
        "2001:db8::/129",
        "2001:db8::1/32",
        "fe80::1%eth0/128",
        "::ffff:127.0.0.1/128",
        "[::1]",
        "[2001:db8::]/32",
        "[203.0.113.0]/24:443",
        "[2001:db8::/32:443",
        "pypi.org:0",
        "pypi.org:65536",
        "pypi.org:0443",
        "pypi.org:+443",
        "pypi.org:",
        "pypi.org:443:443",
        ":443",
        "any:443",
        "none:443",
        "2001:db8::/32:443",
        "http://pypi.org",
        "a_b.example",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const char *allow[] = {"good.example", cases[i], NULL};
        const char *deny[] = {cases[i], NULL};
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(allow, NULL, &error);
        g_autoptr(GError) deny_error = NULL;
        g_autoptr(VmEgressPolicy) deny_policy = vm_egress_policy_new(NULL, deny, &deny_error);
        g_autofree char *quoted = g_strdup_printf("'%s'", cases[i]);

        if (policy != NULL)
            fail_msg("rule '%s' accepted", cases[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        /* The message names the bad rule, not the good one before it. */
        if (strstr(error->message, quoted) == NULL)
            fail_msg("error for '%s' does not name it: %s", cases[i], error->message);
        assert_null(deny_policy);
        assert_true(g_error_matches(deny_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
}

static void
test_shortcuts_stand_alone(void **state)
{
    static const char *const cases[][3] = {
        {"none", "pypi.org", NULL},
        {"pypi.org", "any", NULL},
        {"any", "none", NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(cases[i], NULL, &error);

        assert_null(policy);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Host decisions */

typedef struct {
    const char *allow;
    const char *deny;
    const char *host;
    VmEgressVerdict verdict;
} HostCase;

static void
test_check_host_table(void **state)
{
    static const HostCase cases[] = {
        /* default none */
        {NULL, NULL, "pypi.org", VM_EGRESS_DENY_NO_RULE},
        {"none", NULL, "203.0.113.5", VM_EGRESS_DENY_NO_RULE},
        /* exact names */
        {"pypi.org", NULL, "pypi.org", VM_EGRESS_ALLOW},
        {"pypi.org", NULL, "PYPI.org.", VM_EGRESS_ALLOW},
        {"pypi.org", NULL, "files.pypi.org", VM_EGRESS_DENY_NO_RULE},
        {"pypi.org", NULL, "pypi.org.evil.com", VM_EGRESS_DENY_NO_RULE},
        {"pypi.org", NULL, "xpypi.org", VM_EGRESS_DENY_NO_RULE},
        /* wildcards: subdomains only */
        {"*.github.com", NULL, "api.github.com", VM_EGRESS_ALLOW},
        {"*.github.com", NULL, "a.b.github.com", VM_EGRESS_ALLOW},
        {"*.github.com", NULL, "github.com", VM_EGRESS_DENY_NO_RULE},
        {"*.github.com", NULL, "evilgithub.com", VM_EGRESS_DENY_NO_RULE},
        {"*.github.com", NULL, "github.com.evil", VM_EGRESS_DENY_NO_RULE},
        /* names never match addresses and vice versa */
        {"pypi.org", NULL, "151.101.0.223", VM_EGRESS_DENY_NO_RULE},
        {"203.0.113.0/24", NULL, "pypi.org", VM_EGRESS_DENY_NO_RULE},
        {"203.0.113.0/24", NULL, "203.0.113.9", VM_EGRESS_ALLOW},
        {"203.0.113.0/24", NULL, "203.0.114.9", VM_EGRESS_DENY_NO_RULE},
        {"203.0.113.0/24", NULL, "::ffff:203.0.113.9", VM_EGRESS_ALLOW},
        {"2001:db8::/32", NULL, "2001:db8:1::5", VM_EGRESS_ALLOW},
        {"2001:db8::/32", NULL, "2001:db9::5", VM_EGRESS_DENY_NO_RULE},
        {"2001:db8::/33", NULL, "2001:db8:8000::1", VM_EGRESS_DENY_NO_RULE},
        {"2001:db8::/33", NULL, "2001:db8:7fff::1", VM_EGRESS_ALLOW},
        /* odd spellings: refused outright, even with "any" */
        {"any", NULL, "2130706433", VM_EGRESS_DENY_BAD_HOST},
        {"any", NULL, "0177.0.0.1", VM_EGRESS_DENY_BAD_HOST},
        {"any", NULL, "0x7f000001", VM_EGRESS_DENY_BAD_HOST},
        {"any", NULL, "127.1", VM_EGRESS_DENY_BAD_HOST},
        {"any", NULL, "fe80::1%eth0", VM_EGRESS_DENY_BAD_HOST},
        {"127.0.0.0/8", NULL, "0x7f.0.0.1", VM_EGRESS_DENY_BAD_HOST},
        {"any", NULL, "", VM_EGRESS_DENY_BAD_HOST},
        /* any */
        {"any", NULL, "example.com", VM_EGRESS_ALLOW},
        {"any", NULL, "203.0.113.9", VM_EGRESS_ALLOW},
        /* deny wins */
        {"*.example.com", "bad.example.com", "bad.example.com", VM_EGRESS_DENY_RULE},
        {"*.example.com", "bad.example.com", "ok.example.com", VM_EGRESS_ALLOW},
        {"*.example.com", "*.bad.example.com", "x.bad.example.com", VM_EGRESS_DENY_RULE},
        {"any", "pypi.org", "PyPI.org", VM_EGRESS_DENY_RULE},
        {"pypi.org", "any", "pypi.org", VM_EGRESS_DENY_RULE},
        {"203.0.113.0/24", "203.0.113.128/25", "203.0.113.200", VM_EGRESS_DENY_RULE},
        {"203.0.113.0/24", "203.0.113.128/25", "203.0.113.100", VM_EGRESS_ALLOW},
        {"any", "203.0.113.0/24", "::ffff:203.0.113.1", VM_EGRESS_DENY_RULE},
        {"any", "203.0.113.0/24", "64:ff9b::203.0.113.1", VM_EGRESS_DENY_RULE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, cases[i].deny);
        VmEgressVerdict verdict = vm_egress_policy_check_host(policy, cases[i].host, 443, NULL);

        if (verdict != cases[i].verdict)
            fail_msg("allow='%s' deny='%s' host '%s': %s, expected %s", cases[i].allow,
                     cases[i].deny, cases[i].host, vm_egress_verdict_name(verdict),
                     vm_egress_verdict_name(cases[i].verdict));
    }
}

static void
test_check_host_normalised(void **state)
{
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy("pypi.org 127.0.0.1", NULL);
    g_autofree char *name = NULL;
    g_autofree char *literal = NULL;

    assert_int_equal(vm_egress_policy_check_host(policy, "PyPI.Org.", 443, &name), VM_EGRESS_ALLOW);
    assert_string_equal(name, "pypi.org");
    assert_int_equal(vm_egress_policy_check_host(policy, "::ffff:7f00:1", 80, &literal),
                     VM_EGRESS_ALLOW);
    assert_string_equal(literal, "127.0.0.1");
}

/* Ports: a rule's own port, else 80 and 443 for allow rules and every port for deny rules. */
static void
test_check_ports(void **state)
{
    static const struct {
        const char *allow;
        const char *deny;
        const char *host;
        guint16 port;
        VmEgressVerdict verdict;
    } cases[] = {
        /* no port: 80 and 443 only */
        {"pypi.org", NULL, "pypi.org", 80, VM_EGRESS_ALLOW},
        {"pypi.org", NULL, "pypi.org", 443, VM_EGRESS_ALLOW},
        {"pypi.org", NULL, "pypi.org", 22, VM_EGRESS_DENY_NO_RULE},
        {"pypi.org", NULL, "pypi.org", 8443, VM_EGRESS_DENY_NO_RULE},
        {"*.github.com", NULL, "api.github.com", 22, VM_EGRESS_DENY_NO_RULE},
        {"203.0.113.0/24", NULL, "203.0.113.9", 443, VM_EGRESS_ALLOW},
        {"203.0.113.0/24", NULL, "203.0.113.9", 25, VM_EGRESS_DENY_NO_RULE},
        {"any", NULL, "example.com", 443, VM_EGRESS_ALLOW},
        {"any", NULL, "example.com", 22, VM_EGRESS_DENY_NO_RULE},
        {"any", NULL, "203.0.113.9", 6379, VM_EGRESS_DENY_NO_RULE},
        /* a port: exactly that one */
        {"api.example.com:8443", NULL, "api.example.com", 8443, VM_EGRESS_ALLOW},
        {"api.example.com:8443", NULL, "api.example.com", 443, VM_EGRESS_DENY_NO_RULE},
        {"api.example.com:443", NULL, "api.example.com", 80, VM_EGRESS_DENY_NO_RULE},
        {"*.example.com:22", NULL, "git.example.com", 22, VM_EGRESS_ALLOW},
        {"*.example.com:22", NULL, "example.com", 22, VM_EGRESS_DENY_NO_RULE},
        {"198.51.100.0/24:8443", NULL, "198.51.100.7", 8443, VM_EGRESS_ALLOW},
        {"198.51.100.0/24:8443", NULL, "198.51.100.7", 443, VM_EGRESS_DENY_NO_RULE},
        {"[2001:db8::]/32:443", NULL, "2001:db8::5", 443, VM_EGRESS_ALLOW},
        {"[2001:db8::]/32:443", NULL, "2001:db8::5", 80, VM_EGRESS_DENY_NO_RULE},
        {"a.example:22 a.example", NULL, "a.example", 22, VM_EGRESS_ALLOW},
        {"a.example:22 a.example", NULL, "a.example", 80, VM_EGRESS_ALLOW},
        /* deny: its port, or every port without one */
        {"pypi.org:8080 pypi.org", "pypi.org", "pypi.org", 8080, VM_EGRESS_DENY_RULE},
        {"pypi.org:8080 pypi.org", "pypi.org:443", "pypi.org", 443, VM_EGRESS_DENY_RULE},
        {"pypi.org:8080 pypi.org", "pypi.org:443", "pypi.org", 8080, VM_EGRESS_ALLOW},
        {"pypi.org:8080 pypi.org", "pypi.org:443", "pypi.org", 80, VM_EGRESS_ALLOW},
        {"203.0.113.0/24:22", "203.0.113.9", "203.0.113.9", 22, VM_EGRESS_DENY_RULE},
        {"203.0.113.0/24:22", "203.0.113.9:443", "203.0.113.9", 22, VM_EGRESS_ALLOW},
        {"pypi.org:22", "any", "pypi.org", 22, VM_EGRESS_DENY_RULE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, cases[i].deny);
        VmEgressVerdict verdict =
            vm_egress_policy_check_host(policy, cases[i].host, cases[i].port, NULL);

        if (verdict != cases[i].verdict)
            fail_msg("allow='%s' deny='%s' %s port %u: %s, expected %s", cases[i].allow,
                     cases[i].deny, cases[i].host, cases[i].port, vm_egress_verdict_name(verdict),
                     vm_egress_verdict_name(cases[i].verdict));
    }
}

/* The address decision follows the port too: a CIDR rule opens a special address only at its
 * ports, a deny CIDR refuses only at its ports. */
static void
test_check_address_ports(void **state)
{
    static const struct {
        const char *allow;
        const char *deny;
        const char *address;
        guint16 port;
        VmEgressVerdict verdict;
    } cases[] = {
        {"127.0.0.1/32:8080", NULL, "127.0.0.1", 8080, VM_EGRESS_ALLOW},
        {"127.0.0.1/32:8080", NULL, "127.0.0.1", 443, VM_EGRESS_DENY_ADDRESS},
        {"127.0.0.1/32", NULL, "127.0.0.1", 443, VM_EGRESS_ALLOW},
        {"127.0.0.1/32", NULL, "127.0.0.1", 8080, VM_EGRESS_DENY_ADDRESS},
        {"[fd00::]/8:9000", NULL, "fd00::1", 9000, VM_EGRESS_ALLOW},
        {"[fd00::]/8:9000", NULL, "fd00::1", 9001, VM_EGRESS_DENY_ADDRESS},
        {"any", "203.0.113.0/24:25", "203.0.113.9", 25, VM_EGRESS_DENY_RULE},
        {"any", "203.0.113.0/24:25", "203.0.113.9", 443, VM_EGRESS_ALLOW},
        {"any", "203.0.113.0/24", "203.0.113.9", 8443, VM_EGRESS_DENY_RULE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, cases[i].deny);
        VmEgressAddress address = addr(cases[i].address);
        VmEgressVerdict verdict =
            vm_egress_policy_check_address(policy, &address, cases[i].port, NULL);

        if (verdict != cases[i].verdict)
            fail_msg("allow='%s' deny='%s' %s port %u: %s, expected %s", cases[i].allow,
                     cases[i].deny, cases[i].address, cases[i].port,
                     vm_egress_verdict_name(verdict), vm_egress_verdict_name(cases[i].verdict));
    }
}

/* hostd's check of what an egress worker asks it to connect to: the address check, and a port
 * that some allow rule allows (the worker names no host). */
static void
test_check_connect(void **state)
{
    static const struct {
        const char *allow;
        const char *deny;
        const char *address;
        guint16 port;
        VmEgressVerdict verdict;
    } cases[] = {
        {"127.0.0.1/32:8080", NULL, "127.0.0.1", 8080, VM_EGRESS_ALLOW},
        {"127.0.0.1/32:8080", NULL, "127.0.0.1", 9090, VM_EGRESS_DENY_ADDRESS},
        {"127.0.0.1/32:8080", NULL, "::1", 8080, VM_EGRESS_DENY_ADDRESS},
        {"127.0.0.1/32:8080", NULL, "::ffff:127.0.0.1", 8080, VM_EGRESS_ALLOW},
        {"127.0.0.1/32:8080", NULL, "0.0.0.0", 8080, VM_EGRESS_DENY_ADDRESS},
        {"example.com", NULL, "10.0.0.1", 443, VM_EGRESS_DENY_ADDRESS},
        {"example.com", NULL, "169.254.169.254", 80, VM_EGRESS_DENY_ADDRESS},
        {"example.com", NULL, "93.184.216.34", 443, VM_EGRESS_ALLOW},
        {"example.com", NULL, "93.184.216.34", 22, VM_EGRESS_DENY_NO_RULE},
        {"example.com:8443", NULL, "93.184.216.34", 443, VM_EGRESS_DENY_NO_RULE},
        {"example.com:8443", NULL, "93.184.216.34", 8443, VM_EGRESS_ALLOW},
        {"none", NULL, "93.184.216.34", 443, VM_EGRESS_DENY_NO_RULE},
        {"any", "93.184.216.0/24", "93.184.216.34", 443, VM_EGRESS_DENY_RULE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, cases[i].deny);
        VmEgressAddress address = addr(cases[i].address);
        VmEgressVerdict verdict =
            vm_egress_policy_check_connect(policy, &address, cases[i].port, NULL);

        if (verdict != cases[i].verdict)
            fail_msg("allow='%s' deny='%s' %s port %u: %s, expected %s", cases[i].allow,
                     cases[i].deny, cases[i].address, cases[i].port,
                     vm_egress_verdict_name(verdict), vm_egress_verdict_name(cases[i].verdict));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Address decisions */

static void
test_address_public(void **state)
{
    static const struct {
        const char *address;
        gboolean public;
    } cases[] = {
        {"203.0.113.7", TRUE},
        {"151.101.0.223", TRUE},
        {"2a04:4e42::223", TRUE},
        {"127.0.0.1", FALSE},
        {"127.255.255.254", FALSE},
        {"0.0.0.0", FALSE},
        {"0.1.2.3", FALSE},
        {"10.1.2.3", FALSE},
        {"172.16.0.1", FALSE},
        {"172.31.255.255", FALSE},
        {"172.32.0.1", TRUE},
        {"192.168.1.1", FALSE},
        {"100.64.0.1", FALSE},
        {"100.127.255.255", FALSE},
        {"100.128.0.1", TRUE},
        {"169.254.169.254", FALSE},
        {"224.0.0.1", FALSE},
        {"239.255.255.250", FALSE},
        {"255.255.255.255", FALSE},
        {"::", FALSE},
        {"::1", FALSE},
        {"::127.0.0.1", FALSE},
        {"::ffff:127.0.0.1", FALSE},
        {"::ffff:10.0.0.1", FALSE},
        {"::ffff:169.254.169.254", FALSE},
        {"::ffff:203.0.113.7", TRUE},
        {"64:ff9b::127.0.0.1", FALSE},
        {"64:ff9b::10.0.0.1", FALSE},
        {"64:ff9b::203.0.113.7", TRUE},
        {"2002:7f00:1::", FALSE},
        {"2002:cb00:7107::", TRUE},
        {"fc00::1", FALSE},
        {"fd12:3456::1", FALSE},
        {"fe80::1", FALSE},
        {"febf::1", FALSE},
        {"ff02::1", FALSE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        VmEgressAddress address = addr(cases[i].address);

        if (vm_egress_address_is_public(&address) != cases[i].public)
            fail_msg("'%s' should %sbe public", cases[i].address, cases[i].public ? "" : "not ");
    }
}

typedef struct {
    const char *allow;
    const char *deny;
    const char *address;
    VmEgressVerdict verdict;
} AddressCase;

static void
test_check_address_table(void **state)
{
    static const AddressCase cases[] = {
        /* a name rule never opens a private address */
        {"pypi.org", NULL, "151.101.0.223", VM_EGRESS_ALLOW},
        {"pypi.org", NULL, "127.0.0.1", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "10.0.0.5", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "192.168.1.1", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "169.254.169.254", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "::1", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "::ffff:127.0.0.1", VM_EGRESS_DENY_ADDRESS},
        {"pypi.org", NULL, "fd00::1", VM_EGRESS_DENY_ADDRESS},
        {"any", NULL, "127.0.0.1", VM_EGRESS_DENY_ADDRESS},
        {"any", NULL, "0.0.0.0", VM_EGRESS_DENY_ADDRESS},
        {"any", NULL, "64:ff9b::7f00:1", VM_EGRESS_DENY_ADDRESS},
        {"*.example.com", NULL, "100.64.1.1", VM_EGRESS_DENY_ADDRESS},
        /* an explicit CIDR opens exactly what it covers */
        {"127.0.0.1/32", NULL, "127.0.0.1", VM_EGRESS_ALLOW},
        {"127.0.0.1/32", NULL, "::ffff:127.0.0.1", VM_EGRESS_ALLOW},
        {"127.0.0.1/32", NULL, "127.0.0.2", VM_EGRESS_DENY_ADDRESS},
        {"10.0.0.0/8", NULL, "10.9.9.9", VM_EGRESS_ALLOW},
        {"10.0.0.0/8", NULL, "11.0.0.1", VM_EGRESS_ALLOW},
        {"fd00::/8", NULL, "fd00::1", VM_EGRESS_ALLOW},
        {"fd00::/8", NULL, "fc00::1", VM_EGRESS_DENY_ADDRESS},
        /* "any" is not an explicit CIDR */
        {"0.0.0.0/0", NULL, "127.0.0.1", VM_EGRESS_ALLOW},
        /* deny CIDR wins over an allow CIDR */
        {"127.0.0.0/8", "127.0.0.1/32", "127.0.0.1", VM_EGRESS_DENY_RULE},
        {"any", "203.0.113.0/24", "203.0.113.9", VM_EGRESS_DENY_RULE},
        {"any", "203.0.113.0/24", "2002:cb00:7109::1", VM_EGRESS_DENY_RULE},
        {"127.0.0.1/32", "any", "127.0.0.1", VM_EGRESS_DENY_RULE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(cases[i].allow, cases[i].deny);
        VmEgressAddress address = addr(cases[i].address);
        VmEgressVerdict verdict = vm_egress_policy_check_address(policy, &address, 443, NULL);

        if (verdict != cases[i].verdict)
            fail_msg("allow='%s' deny='%s' address %s: %s, expected %s", cases[i].allow,
                     cases[i].deny, cases[i].address, vm_egress_verdict_name(verdict),
                     vm_egress_verdict_name(cases[i].verdict));
    }
}

static void
test_check_address_local(void **state)
{
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy("any", NULL);
    g_autoptr(VmEgressPolicy) cidr = vm_test_egress_policy("198.51.100.0/24", NULL);
    g_autoptr(GArray) local = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
    g_autoptr(GError) error = NULL;
    g_autoptr(GArray) real = vm_egress_local_addresses(&error);
    VmEgressAddress own = addr("198.51.100.7");
    VmEgressAddress other = addr("198.51.100.8");
    gboolean saw_loopback = FALSE;

    g_array_append_val(local, own);
    assert_int_equal(vm_egress_policy_check_address(policy, &own, 443, local),
                     VM_EGRESS_DENY_ADDRESS);
    assert_int_equal(vm_egress_policy_check_address(policy, &other, 443, local), VM_EGRESS_ALLOW);
    /* an explicit CIDR may open even the host's own address */
    assert_int_equal(vm_egress_policy_check_address(cidr, &own, 443, local), VM_EGRESS_ALLOW);

    assert_non_null(real);
    for (guint i = 0; i < real->len; i++) {
        g_autofree char *text =
            vm_egress_address_to_string(&g_array_index(real, VmEgressAddress, i));

        saw_loopback |= strcmp(text, "127.0.0.1") == 0;
    }
    assert_true(saw_loopback);
}

/* A name whose resolution lands on a private address is refused, as the proxy does it: host
 * check, then every address. */
static void
test_name_resolving_private(void **state)
{
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy("internal.example", NULL);
    static const char *const answers[] = {"10.0.0.5", "192.168.0.1", "127.0.0.1", "fd00::5"};

    assert_int_equal(vm_egress_policy_check_host(policy, "internal.example", 443, NULL),
                     VM_EGRESS_ALLOW);
    for (gsize i = 0; i < G_N_ELEMENTS(answers); i++) {
        VmEgressAddress address = addr(answers[i]);

        assert_int_equal(vm_egress_policy_check_address(policy, &address, 443, NULL),
                         VM_EGRESS_DENY_ADDRESS);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Persistence */

static void
test_keyfile_round_trip(void **state)
{
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(
        "PyPI.org *.github.com 203.0.113.0/24 2001:db8::/32", "bad.github.com");
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GKeyFile) reread = g_key_file_new();
    g_autoptr(VmEgressPolicy) back = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;

    vm_egress_policy_to_keyfile(policy, keyfile, "egress");
    text = g_key_file_to_data(keyfile, NULL, NULL);
    assert_string_equal(text, "[egress]\n"
                              "allow=pypi.org;*.github.com;203.0.113.0/24;2001:db8::/32;\n"
                              "deny=bad.github.com;\n");
    assert_true(g_key_file_load_from_data(reread, text, -1, G_KEY_FILE_NONE, &error));
    back = vm_egress_policy_new_from_keyfile(reread, "egress", &error);
    assert_non_null(back);
    assert_true(vm_egress_policy_equal(policy, back));
}

/* Rules with ports survive the key file; a file written before rules had ports (no port
 * anywhere) still loads, its rules now meaning ports 80 and 443. */
static void
test_keyfile_ports_and_old_files(void **state)
{
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(
        "api.example.com:8443 198.51.100.0/24:8443 [2001:db8::]/32:443 pypi.org", "pypi.org:80");
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GKeyFile) reread = g_key_file_new();
    g_autoptr(GKeyFile) old = g_key_file_new();
    g_autoptr(VmEgressPolicy) back = NULL;
    g_autoptr(VmEgressPolicy) old_policy = NULL;
    g_autoptr(VmEgressPolicy) expect_old = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;

    vm_egress_policy_to_keyfile(policy, keyfile, "egress");
    text = g_key_file_to_data(keyfile, NULL, NULL);
    assert_string_equal(text, "[egress]\n"
                              "allow=api.example.com:8443;198.51.100.0/24:8443;"
                              "[2001:db8::]/32:443;pypi.org;\n"
                              "deny=pypi.org:80;\n");
    assert_true(g_key_file_load_from_data(reread, text, -1, G_KEY_FILE_NONE, &error));
    back = vm_egress_policy_new_from_keyfile(reread, "egress", &error);
    assert_non_null(back);
    assert_true(vm_egress_policy_equal(policy, back));
    assert_int_equal(vm_egress_policy_check_host(back, "api.example.com", 8443, NULL),
                     VM_EGRESS_ALLOW);
    assert_int_equal(vm_egress_policy_check_host(back, "pypi.org", 80, NULL), VM_EGRESS_DENY_RULE);

    /* as an older hostd wrote agents/<name>/egress.ini */
    assert_true(g_key_file_load_from_data(old,
                                          "[egress]\n"
                                          "allow=pypi.org;*.github.com;203.0.113.0/24;"
                                          "2001:db8::/32;\n"
                                          "deny=bad.github.com;\n",
                                          -1, G_KEY_FILE_NONE, &error));
    old_policy = vm_egress_policy_new_from_keyfile(old, "egress", &error);
    assert_non_null(old_policy);
    expect_old = vm_test_egress_policy("pypi.org *.github.com 203.0.113.0/24 2001:db8::/32",
                                       "bad.github.com");
    assert_true(vm_egress_policy_equal(old_policy, expect_old));
    assert_int_equal(vm_egress_policy_check_host(old_policy, "pypi.org", 443, NULL),
                     VM_EGRESS_ALLOW);
    assert_int_equal(vm_egress_policy_check_host(old_policy, "2001:db8::1", 80, NULL),
                     VM_EGRESS_ALLOW);
    assert_int_equal(vm_egress_policy_check_host(old_policy, "pypi.org", 8080, NULL),
                     VM_EGRESS_DENY_NO_RULE);
    assert_int_equal(vm_egress_policy_check_host(old_policy, "bad.github.com", 8080, NULL),
                     VM_EGRESS_DENY_RULE);
}

static void
test_keyfile_defaults_and_errors(void **state)
{
    g_autoptr(GKeyFile) empty = g_key_file_new();
    g_autoptr(GKeyFile) bad = g_key_file_new();
    g_autoptr(VmEgressPolicy) none = NULL;
    g_autoptr(VmEgressPolicy) refused = NULL;
    g_autoptr(VmEgressPolicy) default_policy = vm_egress_policy_new_none();
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) allow = NULL;

    none = vm_egress_policy_new_from_keyfile(empty, "egress", &error);
    assert_non_null(none);
    assert_true(vm_egress_policy_equal(none, default_policy));
    allow = vm_egress_policy_dup_allow(none);
    assert_string_equal(allow[0], "none");
    assert_null(allow[1]);

    assert_true(g_key_file_load_from_data(bad, "[egress]\nallow=pypi.org;0x7f000001;\n", -1,
                                          G_KEY_FILE_NONE, NULL));
    refused = vm_egress_policy_new_from_keyfile(bad, "egress", &error);
    assert_null(refused);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_non_null(strstr(error->message, "0x7f000001"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_normalise_good),
        cmocka_unit_test(test_host_normalise_bad),
        cmocka_unit_test(test_host_too_long),
        cmocka_unit_test(test_rules_normalised),
        cmocka_unit_test(test_rules_bad),
        cmocka_unit_test(test_shortcuts_stand_alone),
        cmocka_unit_test(test_check_host_table),
        cmocka_unit_test(test_check_host_normalised),
        cmocka_unit_test(test_check_ports),
        cmocka_unit_test(test_check_address_ports),
        cmocka_unit_test(test_check_connect),
        cmocka_unit_test(test_address_public),
        cmocka_unit_test(test_check_address_table),
        cmocka_unit_test(test_check_address_local),
        cmocka_unit_test(test_name_resolving_private),
        cmocka_unit_test(test_keyfile_round_trip),
        cmocka_unit_test(test_keyfile_ports_and_old_files),
        cmocka_unit_test(test_keyfile_defaults_and_errors),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
