/* Reading libvirt's XML: disk files and guest forwards of the golden domain XML and of live XML
 * as libvirt returns it (backing chains, decoys in comments, metadata and other namespaces), the
 * DAC owner from capabilities, QEMU's option escaping, and hostile documents: malformed, not a
 * domain, oversized, a document type with an external entity (never loaded), an external DTD and
 * nested entities. Nothing is ever printed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <libxml/parser.h>
#include <libxml/parserInternals.h>

#include "vm-domain.h"
#include "vm-domain-read.h"
#include "vm-error.h"
#include "test-common.h"

typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* ---- helpers ------------------------------------------------------------------------------- */

static char *
read_data(const char *name)
{
    g_autofree char *path = vm_test_data_path("domain-read", name, NULL);

    return vm_test_read_file(path);
}

static char *
read_golden(const char *name)
{
    const char *dir = g_getenv("VM_TEST_GOLDEN");
    g_autofree char *path = g_build_filename(dir != NULL ? dir : "tests/golden", name, NULL);

    return vm_test_read_file(path);
}

/* @strv joined with '|', for one comparison per list. */
static char *
joined(GStrv strv)
{
    assert_non_null(strv);
    return g_strjoinv("|", strv);
}

static void
assert_strv(GStrv strv, const char *expected)
{
    g_autofree char *got = joined(strv);

    assert_string_equal(got, expected);
}

/* Sends fd 2 to a file in @dir until stderr_end(), which returns what was written there. */
static int
stderr_begin(const char *dir)
{
    g_autofree char *path = g_build_filename(dir, "stderr", NULL);
    int saved = dup(STDERR_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    assert_true(saved >= 0 && fd >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    close(fd);
    return saved;
}

static char *
stderr_end(const char *dir, int saved)
{
    g_autofree char *path = g_build_filename(dir, "stderr", NULL);

    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    return vm_test_read_file(path);
}

/* Every external resource libvirt's XML could name goes through libxml2's entity loader: this
 * one counts the attempts and passes them on only when told to. */
static xmlExternalEntityLoader default_loader;
static guint loader_calls;
static gboolean loader_passes;

static xmlParserInputPtr
spy_loader(const char *url, const char *id, xmlParserCtxtPtr ctxt)
{
    loader_calls++;
    return loader_passes ? default_loader(url, id, ctxt) : NULL;
}

static int
spy_setup(void **state)
{
    default_loader = xmlGetExternalEntityLoader();
    xmlSetExternalEntityLoader(spy_loader);
    loader_calls = 0;
    loader_passes = FALSE;
    return vm_test_tmpdir_setup(state);
}

static int
spy_teardown(void **state)
{
    xmlSetExternalEntityLoader(default_loader);
    return vm_test_tmpdir_teardown(state);
}

/* ---- domain XML ---------------------------------------------------------------------------- */

static void
test_golden_disk_files(void **state)
{
    static const struct {
        const char *golden;
        const char *files;
    } cases[] = {
        {"domain-tcg-kernel.xml",
         "/var/lib/hostd/agents/agent-tcg/disk.qcow2|/var/lib/hostd/agents/agent-tcg/seed.iso"},
        {"domain-egress.xml",
         "/var/lib/hostd/agents/agent-tcg/disk.qcow2|/var/lib/hostd/agents/agent-tcg/seed.iso"},
        {"domain-kvm-disk.xml", "/srv/agents/agent-kvm.qcow2"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *xml = read_golden(cases[i].golden);
        g_autoptr(GError) error = NULL;
        g_auto(GStrv) files = vm_domain_read_disk_files(xml, &error);

        assert_null(error);
        assert_strv(files, cases[i].files);
    }
}

static void
test_golden_guestfwds(void **state)
{
    g_autofree char *egress = read_golden("domain-egress.xml");
    g_autofree char *plain = read_golden("domain-tcg-kernel.xml");
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) rules = vm_domain_read_guestfwds(egress, &error);
    g_auto(GStrv) none = NULL;
    g_auto(GStrv) args = NULL;

    assert_null(error);
    assert_strv(rules, "tcp:10.0.2.100:3128-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/agent-tcg/egress.sock'|"
                       "tcp:10.0.2.100:53-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/agent-tcg/egress.sock' dns");
    none = vm_domain_read_guestfwds(plain, &error);
    assert_null(error);
    assert_strv(none, "");
    args = vm_domain_read_qemu_args(plain, &error);
    assert_null(error);
    assert_strv(args, "-netdev|user,id=vmnet0,restrict=on,hostfwd=tcp:127.0.0.1:2201-:22|"
                      "-device|virtio-net-pci,netdev=vmnet0,mac=52:54:00:ab:cd:ef,addr=0x10|"
                      "-sandbox|on,obsolete=deny,resourcecontrol=deny");
}

/* A domain with the in-guest API has three forwards, the proxy's and its resolver's first; one
 * without (every agent made before the API) reads as before, above. */
static void
test_golden_guestfwds_guest_api(void **state)
{
    g_autofree char *xml = read_golden("domain-guest-api.xml");
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) rules = vm_domain_read_guestfwds(xml, &error);

    assert_null(error);
    assert_strv(rules, "tcp:10.0.2.100:3128-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/agent-tcg/egress.sock'|"
                       "tcp:10.0.2.100:53-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/agent-tcg/egress.sock' dns|"
                       "tcp:10.0.2.100:80-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/agent-tcg/api.sock'");
}

/* What the builder escapes, the reader gives back: a command with commas and quotes. */
static void
test_build_then_read(void **state)
{
    VmDomainSpec spec = {
        .name = "agent-rt",
        .uuid = "6f1c8a52-3d4e-4b0a-9c1d-2e3f4a5b6c7d",
        .virt_type = "qemu",
        .cpus = 1,
        .memory_mib = 512,
        .disk_path = "/srv/it's <here> & there/disk.qcow2",
        .mac = "52:54:00:ab:cd:ef",
        .ssh_port = 2201,
        .console_socket = "/srv/console.sock",
        .egress_command = "'/x/connect' '/state,restrict=off,,/egress.sock'",
    };
    g_autoptr(GError) error = NULL;
    g_autofree char *xml = vm_domain_xml_build(&spec, &error);
    g_auto(GStrv) files = NULL;
    g_auto(GStrv) rules = NULL;

    assert_non_null(xml);
    files = vm_domain_read_disk_files(xml, &error);
    assert_null(error);
    assert_strv(files, "/srv/it's <here> & there/disk.qcow2");
    /* No chain given: the top image alone, as libvirt's definition would list it. */
    g_auto(GStrv) top = vm_domain_read_disk_chain(xml, &error);
    assert_null(error);
    assert_strv(top, "/srv/it's <here> & there/disk.qcow2");
    /* A chain given is read back as given. */
    const char *const chain[] = {"/srv/c & 1.qcow2", "/srv/<base>.qcow2", NULL};
    spec.backing_chain = chain;
    g_autofree char *chained = vm_domain_xml_build(&spec, &error);
    assert_null(error);
    g_auto(GStrv) read = vm_domain_read_disk_chain(chained, &error);
    assert_null(error);
    assert_strv(read, "/srv/it's <here> & there/disk.qcow2|/srv/c & 1.qcow2|/srv/<base>.qcow2");
    spec.backing_chain = NULL;
    rules = vm_domain_read_guestfwds(xml, &error);
    assert_null(error);
    assert_strv(rules,
                "tcp:10.0.2.100:3128-cmd:'/x/connect' '/state,restrict=off,,/egress.sock'|"
                "tcp:10.0.2.100:53-cmd:'/x/connect' '/state,restrict=off,,/egress.sock' dns");

    /* No generation ID: none read, and no error. */
    g_autofree char *none = vm_domain_read_genid(xml, &error);
    assert_null(none);
    assert_null(error);
    /* With one: the value written, which a saved state's definition must carry again. */
    spec.genid = "0f4f4b5e-9a57-4d49-9a36-2f1d2f6a7c11";
    g_autofree char *with = vm_domain_xml_build(&spec, &error);
    g_autofree char *genid = vm_domain_read_genid(with, &error);
    assert_null(error);
    assert_string_equal(genid, spec.genid);
    /* A document that is not a domain: an error, not a guess. */
    g_autofree char *bad = vm_domain_read_genid("<capabilities/>", &error);
    assert_null(bad);
    assert_non_null(error);
}

/* The CPU count and memory size, as hostd writes them and as libvirt does (KiB, a current
 * count below the maximum); what has none, or nonsense, is not read. */
static void
test_sizes(void **state)
{
    static const struct {
        const char *xml;
        guint cpus;
        guint memory_mib;
    } good[] = {
        {"<domain><memory unit='MiB'>1024</memory><vcpu>2</vcpu></domain>", 2, 1024},
        {"<domain><memory unit='KiB'>1310720</memory><vcpu placement='static' current='1'>4"
         "</vcpu></domain>",
         4, 1280},
        {"<domain><memory>262144</memory><vcpu>1</vcpu></domain>", 1, 256},
        {"<domain><memory unit='GiB'>2</memory><vcpu>8</vcpu></domain>", 8, 2048},
    };
    static const char *const bad[] = {
        "<domain><vcpu>2</vcpu></domain>",
        "<domain><memory unit='MiB'>1024</memory></domain>",
        "<domain><memory unit='MiB'>1024</memory><vcpu>0</vcpu></domain>",
        "<domain><memory unit='MiB'>-1</memory><vcpu>2</vcpu></domain>",
        "<domain><memory unit='furlong'>1</memory><vcpu>2</vcpu></domain>",
        "<domain><memory unit='KiB'>1000</memory><vcpu>2</vcpu></domain>",
        "<domain><memory unit='GiB'>99999999999999999</memory><vcpu>2</vcpu></domain>",
        "<domain><memory unit='MiB'>1024</memory><vcpu>2</vcpu><vcpu>3</vcpu></domain>",
    };

    (void)state;
    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autoptr(GError) error = NULL;
        guint cpus = 0, memory_mib = 0;
        assert_true(vm_domain_read_sizes(good[i].xml, &cpus, &memory_mib, &error));
        assert_null(error);
        assert_int_equal(cpus, good[i].cpus);
        assert_int_equal(memory_mib, good[i].memory_mib);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        guint cpus = 7, memory_mib = 7;
        assert_false(vm_domain_read_sizes(bad[i], &cpus, &memory_mib, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
        assert_int_equal(cpus + memory_mib, 14);
    }
    g_autoptr(GError) error = NULL;
    guint cpus, memory_mib;
    assert_false(vm_domain_read_sizes("<capabilities/>", &cpus, &memory_mib, &error));
    assert_non_null(error);
}

/* Live XML as libvirt returns it after a snapshot: the top image of each disk only, not its
 * backingStore, not a cdrom without a file, not what sits in <metadata> or a comment. */
static void
test_live(void **state)
{
    g_autofree char *xml = read_data("live.xml");
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) files = vm_domain_read_disk_files(xml, &error);
    g_auto(GStrv) rules = NULL;

    assert_null(error);
    assert_strv(
        files, "/var/lib/hostd/agents/agent-a/disk-2.qcow2|/var/lib/hostd/agents/agent-a/seed.iso");
    /* The chain of vda, top-down, and nothing of the cdrom, the comment or <metadata>. */
    g_auto(GStrv) chain = vm_domain_read_disk_chain(xml, &error);
    assert_null(error);
    assert_strv(chain, "/var/lib/hostd/agents/agent-a/disk-2.qcow2|"
                       "/var/lib/hostd/agents/agent-a/disk.qcow2|"
                       "/var/lib/hostd/images/debian-12/base.qcow2");
    rules = vm_domain_read_guestfwds(xml, &error);
    assert_null(error);
    assert_strv(rules, "tcp:10.0.2.100:3128-cmd:'/usr/libexec/vm-egress-connect' "
                       "'/var/lib/hostd/agents/a,b/egress.sock'");
}

/* Text that a substring search would take for a disk or a guest forward. */
static void
test_decoys(void **state)
{
    g_autofree char *xml = read_data("decoy.xml");
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) files = vm_domain_read_disk_files(xml, &error);
    g_auto(GStrv) rules = NULL;
    g_auto(GStrv) args = NULL;

    assert_null(error);
    assert_strv(files, "/srv/b/it's & <new>.qcow2");
    args = vm_domain_read_qemu_args(xml, &error);
    assert_null(error);
    assert_int_equal(g_strv_length(args), 5);
    /* Only -netdev values count; a doubled comma is inside the first forward's command. */
    rules = vm_domain_read_guestfwds(xml, &error);
    assert_null(error);
    assert_strv(rules, "tcp:10.0.2.7:80-cmd:a,guestfwd=tcp:10.0.2.100:3128-cmd:b");
}

static void
test_qemu_opts_split(void **state)
{
    static const struct {
        const char *opts;
        const char *parts;
    } cases[] = {
        {"", ""},
        {"user", "user"},
        {"user,id=a", "user|id=a"},
        {"a,,b", "a,b"},
        {"a,,,b", "a,|b"},
        {"a,,,,b", "a,,b"},
        {",a,", "|a|"},
        {",", "|"},
        {",,", ","},
        {"x=1,,2,y=3", "x=1,2|y=3"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(GStrv) parts = vm_qemu_opts_split(cases[i].opts);
        g_autofree char *got = joined(parts);

        if (!g_str_equal(got, cases[i].parts))
            fail_msg("'%s' split into '%s', not '%s'", cases[i].opts, got, cases[i].parts);
    }
}

/* ---- capabilities -------------------------------------------------------------------------- */

static void
test_capabilities(void **state)
{
    g_autofree char *caps = read_data("capabilities.xml");
    g_autofree char *test_driver = read_data("capabilities-no-dac.xml");
    g_autoptr(GError) error = NULL;
    guint uid = 1, gid = 1;

    /* The apparmor model's label of the same type is not the DAC one. */
    assert_true(vm_capabilities_read_dac_owner(caps, "kvm", &uid, &gid, &error));
    assert_null(error);
    assert_int_equal(uid, 64055);
    assert_int_equal(gid, 994);
    assert_true(vm_capabilities_read_dac_owner(caps, "qemu", &uid, &gid, &error));
    assert_int_equal(gid, 64055);

    uid = gid = 7;
    assert_false(vm_capabilities_read_dac_owner(caps, "test", &uid, &gid, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "'test'");
    g_clear_error(&error);
    assert_false(vm_capabilities_read_dac_owner(test_driver, "qemu", &uid, &gid, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, NULL);
    g_clear_error(&error);
    assert_int_equal(uid, 7);
    assert_int_equal(gid, 7);

    /* A domain is not capabilities. */
    g_autofree char *domain = read_golden("domain-kvm-disk.xml");
    assert_false(vm_capabilities_read_dac_owner(domain, "kvm", &uid, &gid, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "<capabilities>");
}

static void
test_capabilities_labels(void **state)
{
    static const struct {
        const char *label;
        guint uid, gid; /* 0, 0: refused */
    } cases[] = {
        {"+64055:+64055", 64055, 64055},
        {"+0:+0", 0, 0},
        {"+1:+4294967294", 1, 4294967294u},
        {"+1:+4294967295", 0, 0},
        {"+1:+99999999999", 0, 0},
        {"libvirt-qemu:kvm", 0, 0},
        {"64055:64055", 0, 0},
        {"+64055", 0, 0},
        {"+1:+2:+3", 0, 0},
        {"+-1:+2", 0, 0},
        {"++1:+2", 0, 0},
        {"+1 :+2", 0, 0},
        {"+1:+2x", 0, 0},
        {"", 0, 0},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *escaped = g_markup_escape_text(cases[i].label, -1);
        g_autofree char *caps =
            g_strdup_printf("<capabilities><host><secmodel><model>dac</model><doi>0</doi>"
                            "<baselabel type='kvm'>%s</baselabel></secmodel></host></capabilities>",
                            escaped);
        g_autoptr(GError) error = NULL;
        guint uid = 7, gid = 7;
        gboolean ok = vm_capabilities_read_dac_owner(caps, "kvm", &uid, &gid, &error);
        gboolean good = cases[i].uid != 0 || g_str_equal(cases[i].label, "+0:+0");

        if (ok != good)
            fail_msg("label '%s': %s", cases[i].label, ok ? "taken" : error->message);
        if (good) {
            assert_int_equal(uid, cases[i].uid);
            assert_int_equal(gid, cases[i].gid);
        } else {
            vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "not +UID:+GID");
            assert_int_equal(uid, 7);
        }
    }
}

/* ---- hostile documents --------------------------------------------------------------------- */

static const struct {
    const char *name;
    const char *needle;
} bad_documents[] = {
    {"malformed.xml", "not well-formed: line"},
    {"not-a-domain.xml", "root is not <domain>"},
    {"external-entity.xml", "document type declaration"},
    {"external-dtd.xml", "document type declaration"},
    {"entity-expansion.xml", "document type declaration"},
    {"capabilities.xml", "root is not <domain>"},
};

static void
test_bad_documents(void **state)
{
    Fixture *f = *state;

    for (gsize i = 0; i < G_N_ELEMENTS(bad_documents); i++) {
        g_autofree char *xml = read_data(bad_documents[i].name);
        g_autoptr(GError) files_error = NULL;
        g_autoptr(GError) args_error = NULL;
        g_autoptr(GError) rules_error = NULL;
        int saved = stderr_begin(f->dir);
        g_auto(GStrv) files = vm_domain_read_disk_files(xml, &files_error);
        g_auto(GStrv) args = vm_domain_read_qemu_args(xml, &args_error);
        g_auto(GStrv) rules = vm_domain_read_guestfwds(xml, &rules_error);
        g_autofree char *printed = stderr_end(f->dir, saved);

        if (files != NULL)
            fail_msg("%s read", bad_documents[i].name);
        vm_test_assert_error(files_error, VM_ERROR, VM_ERROR_FAILED, bad_documents[i].needle);
        assert_null(args);
        vm_test_assert_error(args_error, VM_ERROR, VM_ERROR_FAILED, bad_documents[i].needle);
        assert_null(rules);
        vm_test_assert_error(rules_error, VM_ERROR, VM_ERROR_FAILED, bad_documents[i].needle);
        assert_string_equal(printed, "");
    }
    assert_int_equal(loader_calls, 0);
}

/* The external entity is never loaded, and not because the fixture is broken: libxml2 with
 * entity substitution on does load it and puts its disk into the document. */
static void
test_external_entity_not_loaded(void **state)
{
    g_autofree char *path = vm_test_data_path("domain-read", "external-entity.xml", NULL);
    g_autofree char *xml = read_data("external-entity.xml");
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) files = vm_domain_read_disk_files(xml, &error);
    xmlChar *dump = NULL;
    int dump_len = 0;

    assert_null(files);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "document type declaration");
    assert_int_equal(loader_calls, 0);

    loader_passes = TRUE;
    xmlDoc *doc = xmlReadFile(path, NULL, XML_PARSE_NOENT | XML_PARSE_NOERROR);
    assert_non_null(doc);
    assert_true(loader_calls > 0);
    xmlDocDumpMemory(doc, &dump, &dump_len);
    assert_non_null(strstr((const char *)dump, "/leaked/from/an/external/entity"));
    xmlFree(dump);
    xmlFreeDoc(doc);
}

static void
test_oversized(void **state)
{
    gsize len = VM_DOMAIN_READ_MAX + 1;
    g_autofree char *huge = g_malloc(len + 1);
    static const char head[] = "<domain><devices><disk><source file='/a'/></disk></devices>";
    g_autoptr(GError) error = NULL;

    memset(huge, ' ', len);
    memcpy(huge, head, strlen(head));
    memcpy(huge + len - strlen("</domain>"), "</domain>", strlen("</domain>"));
    huge[len] = '\0';
    assert_null(vm_domain_read_disk_files(huge, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "more than");
    g_clear_error(&error);

    /* At the limit it is read. */
    memmove(huge + len - 1 - strlen("</domain>"), "</domain>", strlen("</domain>"));
    huge[len - 1] = '\0';
    g_auto(GStrv) files = vm_domain_read_disk_files(huge, &error);
    assert_null(error);
    assert_strv(files, "/a");
}

static void
test_odd_documents(void **state)
{
    static const struct {
        const char *xml;
        const char *files; /* NULL: refused */
    } cases[] = {
        {"", NULL},
        {"<domain/>", ""},
        {"<domain></domain>trailing", NULL},
        {"<domain><devices><disk><source file=''/></disk></devices></domain>", ""},
        {"<domain><devices><disk><source/></disk></devices></domain>", ""},
        {"<domain><devices><disk><source file='/a&#10;b'/></disk></devices></domain>", "/a\nb"},
        {"<domain><devices><disk><source file='/a&undefined;'/></disk></devices></domain>", NULL},
        {"<domain><devices><disk><source file='/a' file='/b'/></disk></devices></domain>", NULL},
        {"<x:domain xmlns:x='urn:x'><devices/></x:domain>", NULL},
        {"<?xml version='1.0' encoding='ISO-8859-1'?><domain><devices><disk>"
         "<source file='/\xe9'/></disk></devices></domain>",
         "/\xc3\xa9"},
        {"<domain><devices><disk><source file='/\xff'/></disk></devices></domain>", NULL},
        {"<domain><devices><disk><source file='/a'/></disk><disk><source file='/b'/>"
         "</disk></devices><devices><disk><source file='/c'/></disk></devices></domain>",
         "/a|/b|/c"},
        {"<domain><devices><disk><![CDATA[<source file='/cdata'/>]]></disk></devices></domain>",
         ""},
        {"<?xml-stylesheet href='http://x.invalid/a.xsl'?><domain/>", ""},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_auto(GStrv) files = vm_domain_read_disk_files(cases[i].xml, &error);

        if (cases[i].files == NULL) {
            if (files != NULL)
                fail_msg("case %zu read", i);
            vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, NULL);
            continue;
        }
        if (files == NULL)
            fail_msg("case %zu: %s", i, error->message);
        g_autofree char *got = joined(files);
        if (!g_str_equal(got, cases[i].files))
            fail_msg("case %zu: '%s', not '%s'", i, got, cases[i].files);
    }
    assert_int_equal(loader_calls, 0);
}

/* Many threads read at once (hostd serves each request on a thread of its own). */
static gpointer
read_in_thread(gpointer data)
{
    const char *xml = data;

    for (int i = 0; i < 50; i++) {
        g_auto(GStrv) files = vm_domain_read_disk_files(xml, NULL);
        if (files == NULL || g_strv_length(files) != 2)
            return GINT_TO_POINTER(FALSE);
    }
    return GINT_TO_POINTER(TRUE);
}

static void
test_threads(void **state)
{
    g_autofree char *xml = read_data("live.xml");
    GThread *threads[8];

    for (gsize i = 0; i < G_N_ELEMENTS(threads); i++)
        threads[i] = g_thread_new("read", read_in_thread, xml);
    for (gsize i = 0; i < G_N_ELEMENTS(threads); i++)
        assert_true(GPOINTER_TO_INT(g_thread_join(threads[i])));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        /* First, so that it is also the first use of libxml2 in the process. */
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_golden_disk_files),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_golden_guestfwds),
        cmocka_unit_test(test_golden_guestfwds_guest_api),
        cmocka_unit_test(test_build_then_read),
        cmocka_unit_test(test_live),
        cmocka_unit_test(test_decoys),
        cmocka_unit_test(test_qemu_opts_split),
        cmocka_unit_test(test_capabilities),
        cmocka_unit_test(test_capabilities_labels),
        cmocka_unit_test_setup_teardown(test_bad_documents, spy_setup, spy_teardown),
        cmocka_unit_test_setup_teardown(test_external_entity_not_loaded, spy_setup, spy_teardown),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test_setup_teardown(test_odd_documents, spy_setup, spy_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
