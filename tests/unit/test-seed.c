/* Tests for the cloud-init NoCloud seed: golden user-data/meta-data, bad inputs, a YAML
 * round-trip through libyaml, the MIME structure (also through Python's email parser, the one
 * cloud-init uses, when python3 is there) and the ISO read back with isoinfo. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-seed.h"
#include "vm-spawn.h"
#include "test-common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>
#include <yaml.h>

#define TEST_PRIVATE_KEY                                                                           \
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"                                                        \
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"                     \
    "QyNTUxOQAAACBGYWtlSG9zdEtleUZvclRlc3RzT25seTAwMDAwMDAwMDAwMAAAAJBGYWtl\n"                     \
    "RmFrZUZha2VGYWtlRmFrZUZha2VGYWtlRmFrZUZha2VGYWtlRmFrZUZha2VGYWtlRmFrZQ\n"                     \
    "-----END OPENSSH PRIVATE KEY-----\n"
#define TEST_PUBLIC_KEY                                                                            \
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VIb3N0S2V5Rm9yVGVzdHNPbmx5MDAwMDAw root@agent-1"
#define TEST_AUTHORIZED_KEY                                                                        \
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VDbGllbnRLZXlGb3JUZXN0c09ubHkwMDAw hostd@test"
#define TEST_MERGE_TYPE "list(append)+dict(no_replace,recurse_list)+str()"

static char *test_tmp_root; /* $TMPDIR for the whole run: vm_seed_write_iso's scratch space */

typedef struct {
    VmSeedSpec spec;
    char *dir;
} Fixture;

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->spec = (VmSeedSpec){
        .hostname = "agent-1",
        .instance_id = "iid-agent-1-0001",
        .user = "agent",
        .authorized_key = TEST_AUTHORIZED_KEY,
        .host_key_private = TEST_PRIVATE_KEY,
        .host_key_public = TEST_PUBLIC_KEY,
    };
    f->dir = vm_test_make_tmpdir("test-seed-XXXXXX");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f);
    return 0;
}

/* Golden files ----------------------------------------------------------------------------- */

/* MIME ------------------------------------------------------------------------------------- */

typedef struct {
    char *content_type; /* without parameters */
    char *encoding;
    char *merge_type;
    char *filename;
    char *body; /* decoded */
} MimePart;

static void
mime_part_clear(MimePart *part)
{
    g_free(part->content_type);
    g_free(part->encoding);
    g_free(part->merge_type);
    g_free(part->filename);
    g_free(part->body);
}

static char *
header_param(const char *value, const char *name)
{
    g_autofree char *key = g_strdup_printf("%s=\"", name);
    const char *start = strstr(value, key);

    if (start == NULL)
        return NULL;
    start += strlen(key);
    return g_strndup(start, strchr(start, '"') - start);
}

/* Splits the multipart @text the way hostd writes it (LF line ends, one header per line) and
 * checks the framing on the way: the boundary occurs only as delimiters, and the line break
 * before each delimiter is the delimiter's. Returns the parts as a GArray of MimePart. */
static GArray *
mime_split(const char *text)
{
    GArray *parts = g_array_new(FALSE, TRUE, sizeof(MimePart));
    g_array_set_clear_func(parts, (GDestroyNotify)mime_part_clear);

    assert_true(g_str_has_prefix(text, "Content-Type: multipart/mixed; boundary=\""));
    /* cloud-init only looks for the MIME header in the first 4 KiB. */
    g_autofree char *head = g_ascii_strdown(text, MIN(strlen(text), 4096));
    assert_non_null(strstr(head, "mime-version: 1.0"));

    const char *eol = strchr(text, '\n');
    g_autofree char *first = g_strndup(text, eol - text);
    g_autofree char *boundary = header_param(first, "boundary");
    assert_non_null(boundary);

    g_autofree char *open = g_strdup_printf("\n--%s\n", boundary);
    g_autofree char *next = g_strdup_printf("\n--%s", boundary);
    g_autofree char *close = g_strdup_printf("\n--%s--\n", boundary);
    assert_true(g_str_has_suffix(text, close));

    const char *p = strstr(text, "\n\n");
    assert_non_null(p);
    p += 1; /* the delimiter's own line break */
    guint occurrences = 0;
    for (const char *q = text; (q = strstr(q, boundary)) != NULL; q++)
        occurrences++;

    while (g_str_has_prefix(p, open)) {
        MimePart part = {0};
        p += strlen(open);
        const char *headers_end = strstr(p, "\n\n");
        assert_non_null(headers_end);
        g_autofree char *headers = g_strndup(p, headers_end - p);
        g_auto(GStrv) lines = g_strsplit(headers, "\n", -1);
        for (char **line = lines; *line != NULL; line++) {
            if (g_str_has_prefix(*line, "Content-Type: ")) {
                const char *v = *line + strlen("Content-Type: ");
                part.content_type = g_strndup(v, strcspn(v, ";"));
                g_autofree char *charset = header_param(v, "charset");
                assert_string_equal(charset, "utf-8");
            } else if (g_str_has_prefix(*line, "Content-Transfer-Encoding: ")) {
                part.encoding = g_strdup(*line + strlen("Content-Transfer-Encoding: "));
            } else if (g_str_has_prefix(*line, "Merge-Type: ")) {
                part.merge_type = g_strdup(*line + strlen("Merge-Type: "));
            } else if (g_str_has_prefix(*line, "Content-Disposition: attachment; ")) {
                part.filename = header_param(*line, "filename");
            } else {
                assert_string_equal(*line, "MIME-Version: 1.0");
            }
        }
        assert_non_null(part.content_type);
        assert_non_null(part.encoding);
        assert_non_null(part.filename);

        const char *body = headers_end + 2;
        const char *end = strstr(body, next);
        assert_non_null(end);
        g_autofree char *raw = g_strndup(body, end - body);
        if (strcmp(part.encoding, "base64") == 0) {
            gsize len = 0;
            guchar *decoded = g_base64_decode(raw, &len);
            part.body = g_strndup((const char *)decoded, len);
            g_free(decoded);
        } else {
            assert_string_equal(part.encoding, "7bit");
            part.body = g_steal_pointer(&raw);
        }
        g_array_append_val(parts, part);
        p = end;
    }
    assert_string_equal(p, close);
    /* Once in the header, once per part, once closing: never inside a part. */
    assert_int_equal(occurrences, parts->len + 2);
    return parts;
}

static MimePart *
mime_part(GArray *parts, guint i)
{
    assert_true(i < parts->len);
    return &g_array_index(parts, MimePart, i);
}

/* Feeds @user_data to Python's email parser as cloud-init does (message_from_string, then
 * get_payload(decode=True) as UTF-8) and checks each part's type, Merge-Type and text. Without
 * python3 it skips the running test, so it goes after the test's other checks. */
static void
check_with_python(const char *dir, const char *user_data, const char *const *types,
                  const char *const *merge_types, const char *const *bodies, guint n)
{
    static const char script[] =
        "import email, sys\n"
        "d = sys.argv[1]\n"
        "text = open(d + '/user-data', encoding='utf-8', newline='').read()\n"
        "msg = email.message_from_string(text)\n"
        "assert msg.is_multipart(), 'not multipart'\n"
        "parts = [p for p in msg.walk() if p.get_content_maintype() != 'multipart']\n"
        "n = int(open(d + '/n').read())\n"
        "assert len(parts) == n, 'parts: %d' % len(parts)\n"
        "for i, p in enumerate(parts):\n"
        "    want = open('%s/%d.type' % (d, i)).read()\n"
        "    assert p.get_content_type() == want, (i, p.get_content_type())\n"
        "    want = open('%s/%d.merge' % (d, i)).read()\n"
        "    assert (p.get('Merge-Type') or '') == want, (i, p.get('Merge-Type'))\n"
        "    got = p.get_payload(decode=True).decode('utf-8')\n"
        "    want = open('%s/%d.body' % (d, i), encoding='utf-8', newline='').read()\n"
        "    assert got == want, (i, got, want)\n";
    g_autofree char *python = g_find_program_in_path("python3");

    if (python == NULL) {
        print_message("# SKIP: python3 not found, no check through Python's email parser\n");
        skip();
    }

    g_autofree char *pydir = g_build_filename(dir, "py", NULL);
    assert_int_equal(g_mkdir(pydir, 0700), 0);
    g_autofree char *ud = g_build_filename(pydir, "user-data", NULL);
    assert_true(g_file_set_contents(ud, user_data, -1, NULL));
    g_autofree char *np = g_build_filename(pydir, "n", NULL);
    g_autofree char *ns = g_strdup_printf("%u", n);
    assert_true(g_file_set_contents(np, ns, -1, NULL));
    for (guint i = 0; i < n; i++) {
        g_autofree char *t = g_strdup_printf("%s/%u.type", pydir, i);
        g_autofree char *m = g_strdup_printf("%s/%u.merge", pydir, i);
        g_autofree char *b = g_strdup_printf("%s/%u.body", pydir, i);
        assert_true(g_file_set_contents(t, types[i], -1, NULL));
        assert_true(g_file_set_contents(m, merge_types[i] ? merge_types[i] : "", -1, NULL));
        assert_true(g_file_set_contents(b, bodies[i], -1, NULL));
    }

    const char *argv[] = {python, "-c", script, pydir, NULL};
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;
    int status = 0;
    assert_true(g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, &out, &err,
                             &status, NULL));
    if (!g_spawn_check_wait_status(status, NULL)) {
        print_error("python3 email check failed:\n%s%s\n", out, err);
        fail();
    }
}

/* YAML ------------------------------------------------------------------------------------- */

typedef struct {
    yaml_document_t doc;
    gboolean loaded;
} YamlDoc;

static void
yaml_doc_free(YamlDoc *y)
{
    if (y->loaded)
        yaml_document_delete(&y->doc);
    g_free(y);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(YamlDoc, yaml_doc_free)

/* Parses @text as one YAML document with libyaml; fails the test on a parse error. */
static YamlDoc *
yaml_load(const char *text)
{
    YamlDoc *y = g_new0(YamlDoc, 1);
    yaml_parser_t parser;

    assert_true(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    if (!yaml_parser_load(&parser, &y->doc)) {
        print_error("YAML error: %s at line %zu column %zu\n%s\n", parser.problem,
                    parser.problem_mark.line + 1, parser.problem_mark.column + 1, text);
        yaml_parser_delete(&parser);
        g_free(y);
        fail();
    }
    y->loaded = TRUE;
    yaml_parser_delete(&parser);
    assert_non_null(yaml_document_get_root_node(&y->doc));
    return y;
}

static yaml_node_t *
yaml_get(YamlDoc *y, yaml_node_t *map, const char *key)
{
    assert_non_null(map);
    assert_int_equal(map->type, YAML_MAPPING_NODE);
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top;
         pair++) {
        yaml_node_t *k = yaml_document_get_node(&y->doc, pair->key);
        if (k->type == YAML_SCALAR_NODE && strcmp((const char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(&y->doc, pair->value);
    }
    return NULL;
}

static guint
yaml_len(yaml_node_t *node)
{
    assert_non_null(node);
    if (node->type == YAML_SEQUENCE_NODE)
        return node->data.sequence.items.top - node->data.sequence.items.start;
    assert_int_equal(node->type, YAML_MAPPING_NODE);
    return node->data.mapping.pairs.top - node->data.mapping.pairs.start;
}

static yaml_node_t *
yaml_item(YamlDoc *y, yaml_node_t *seq, guint i)
{
    assert_non_null(seq);
    assert_int_equal(seq->type, YAML_SEQUENCE_NODE);
    assert_true(i < yaml_len(seq));
    return yaml_document_get_node(&y->doc, seq->data.sequence.items.start[i]);
}

/* A string: a scalar that a YAML loader cannot read as anything else. */
static void
assert_yaml_string(yaml_node_t *node, const char *expected)
{
    assert_non_null(node);
    assert_int_equal(node->type, YAML_SCALAR_NODE);
    assert_int_not_equal(node->data.scalar.style, YAML_PLAIN_SCALAR_STYLE);
    assert_int_equal(node->data.scalar.length, strlen(expected));
    assert_memory_equal(node->data.scalar.value, expected, strlen(expected));
}

/* A boolean: a plain true/false. */
static void
assert_yaml_bool(yaml_node_t *node, gboolean expected)
{
    assert_non_null(node);
    assert_int_equal(node->type, YAML_SCALAR_NODE);
    assert_int_equal(node->data.scalar.style, YAML_PLAIN_SCALAR_STYLE);
    assert_string_equal((const char *)node->data.scalar.value, expected ? "true" : "false");
}

/* Checks that @user_data (hostd's own #cloud-config) says exactly what @spec asks. */
static void
assert_cloud_config_matches(const char *cloud_config, const VmSeedSpec *spec)
{
    static const char *const keys[] = {
        "hostname",   "fqdn",           "manage_etc_hosts", "users",    "disable_root",
        "ssh_pwauth", "ssh_deletekeys", "ssh_genkeytypes",  "ssh_keys",
    };
    gboolean has_packages = spec->packages != NULL && spec->packages[0] != NULL;
    gboolean has_proxy = spec->egress_proxy != NULL;
    gboolean has_resolver = spec->egress_resolver != NULL;
    gboolean has_ca = spec->egress_ca_pem != NULL;
    gboolean has_env = spec->environment_block != NULL;

    assert_true(g_str_has_prefix(cloud_config, "#cloud-config\n"));
    g_autoptr(YamlDoc) y = yaml_load(cloud_config);
    yaml_node_t *root = yaml_document_get_root_node(&y->doc);

    /* No value may have smuggled in a key of its own. */
    /* write_files and runcmd always: hostd's sshd on the virtio port. */
    assert_int_equal(yaml_len(root), G_N_ELEMENTS(keys) + has_packages + 2);
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++) {
        if (yaml_get(y, root, keys[i]) == NULL) {
            print_error("key %s missing\n", keys[i]);
            fail();
        }
    }

    assert_yaml_string(yaml_get(y, root, "hostname"), spec->hostname);
    assert_yaml_string(yaml_get(y, root, "fqdn"), spec->hostname);
    assert_yaml_bool(yaml_get(y, root, "manage_etc_hosts"), TRUE);
    assert_yaml_bool(yaml_get(y, root, "disable_root"), TRUE);
    assert_yaml_bool(yaml_get(y, root, "ssh_pwauth"), FALSE);
    assert_yaml_bool(yaml_get(y, root, "ssh_deletekeys"), TRUE);
    assert_int_equal(yaml_len(yaml_get(y, root, "ssh_genkeytypes")), 0);

    yaml_node_t *users = yaml_get(y, root, "users");
    assert_int_equal(yaml_len(users), 1);
    yaml_node_t *user = yaml_item(y, users, 0);
    assert_int_equal(yaml_len(user), 5);
    assert_yaml_string(yaml_get(y, user, "name"), spec->user);
    assert_yaml_string(yaml_get(y, user, "sudo"), "ALL=(ALL) NOPASSWD:ALL");
    assert_yaml_string(yaml_get(y, user, "shell"), "/bin/bash");
    assert_yaml_bool(yaml_get(y, user, "lock_passwd"), TRUE);
    yaml_node_t *keys_node = yaml_get(y, user, "ssh_authorized_keys");
    guint n_user_keys = spec->user_keys != NULL ? g_strv_length((char **)spec->user_keys) : 0;
    assert_int_equal(yaml_len(keys_node), 1 + n_user_keys);
    assert_yaml_string(yaml_item(y, keys_node, 0), spec->authorized_key);
    for (guint i = 0; i < n_user_keys; i++)
        assert_yaml_string(yaml_item(y, keys_node, 1 + i), spec->user_keys[i]);

    yaml_node_t *ssh_keys = yaml_get(y, root, "ssh_keys");
    assert_int_equal(yaml_len(ssh_keys), 2);
    assert_yaml_string(yaml_get(y, ssh_keys, "ed25519_private"), spec->host_key_private);
    assert_yaml_string(yaml_get(y, ssh_keys, "ed25519_public"), spec->host_key_public);

    yaml_node_t *files = yaml_get(y, root, "write_files");
    yaml_node_t *runcmd = yaml_get(y, root, "runcmd");
    assert_int_equal(yaml_len(files), (has_proxy ? 3 : 0) + has_resolver + has_ca + has_env +
                                          (spec->guest_tool ? 1 : 0) + 2);
    if (has_proxy) {
        const char *url = spec->egress_proxy;
        g_autofree char *no_proxy =
            g_strconcat("localhost,127.0.0.1,::1", spec->guest_api_host != NULL ? "," : "",
                        spec->guest_api_host != NULL ? spec->guest_api_host : "", NULL);
        g_autofree char *environment =
            g_strdup_printf("http_proxy=%s\nhttps_proxy=%s\nHTTP_PROXY=%s\nHTTPS_PROXY=%s\n"
                            "no_proxy=%s\nNO_PROXY=%s\n",
                            url, url, url, url, no_proxy, no_proxy);
        g_autofree char *apt = g_strdup_printf(
            "Acquire::http::Proxy \"%s\";\nAcquire::https::Proxy \"%s\";\n", url, url);
        yaml_node_t *file;

        file = yaml_item(y, files, 0);
        assert_yaml_string(yaml_get(y, file, "path"), "/etc/environment");
        assert_yaml_bool(yaml_get(y, file, "append"), TRUE);
        assert_yaml_string(yaml_get(y, file, "content"), environment);
        file = yaml_item(y, files, 1);
        assert_yaml_string(yaml_get(y, file, "path"), "/etc/profile.d/vmctl-egress.sh");
        file = yaml_item(y, files, 2);
        assert_yaml_string(yaml_get(y, file, "path"), "/etc/apt/apt.conf.d/90vmctl-egress");
        assert_yaml_string(yaml_get(y, file, "content"), apt);
    }
    if (has_resolver) {
        yaml_node_t *file = yaml_item(y, files, has_proxy ? 3 : 0);
        g_autofree char *resolv =
            g_strdup_printf("nameserver %s\noptions use-vc\n", spec->egress_resolver);

        assert_yaml_string(yaml_get(y, file, "path"), "/etc/resolv.conf");
        assert_yaml_string(yaml_get(y, file, "content"), resolv);
    }
    if (has_ca) {
        yaml_node_t *file = yaml_item(y, files, (has_proxy ? 3 : 0) + has_resolver);

        assert_yaml_string(yaml_get(y, file, "path"), VM_SEED_EGRESS_CA_PATH);
        assert_yaml_string(yaml_get(y, file, "permissions"), "0644");
        assert_yaml_string(yaml_get(y, file, "content"), spec->egress_ca_pem);
        /* Trusted at once by the script hostd's live grants run too, not a whole store
         * rebuild. */
        static const char *const trust[] = {"sh",
                                            "-c",
                                            VM_SEED_TRUST_CA_SCRIPT,
                                            "sh",
                                            VM_SEED_EGRESS_CA_PATH,
                                            "",
                                            VM_SEED_CA_BUNDLE_PATH};
        yaml_node_t *cmd = yaml_item(y, runcmd, 0);
        assert_int_equal(yaml_len(cmd), G_N_ELEMENTS(trust));
        for (guint i = 0; i < G_N_ELEMENTS(trust); i++)
            assert_yaml_string(yaml_item(y, cmd, (int)i), trust[i]);
    }
    /* Last: the sshd on the virtio port, written and enabled (hostd/hostd-ssh-serial.h). */
    {
        static const char *const enable[] = {"systemctl", "enable", "--now",
                                             "vmctl-ssh-serial.service"};
        yaml_node_t *script = yaml_item(y, files, yaml_len(files) - 2);
        yaml_node_t *unit = yaml_item(y, files, yaml_len(files) - 1);
        yaml_node_t *command = yaml_item(y, runcmd, yaml_len(runcmd) - 1);

        assert_int_equal(yaml_len(runcmd), 1 + has_ca);
        assert_yaml_string(yaml_get(y, script, "path"), "/usr/local/libexec/vmctl-ssh-serial");
        assert_yaml_string(yaml_get(y, script, "permissions"), "0755");
        assert_yaml_string(yaml_get(y, unit, "path"),
                           "/etc/systemd/system/vmctl-ssh-serial.service");
        assert_yaml_string(yaml_get(y, unit, "permissions"), "0644");
        assert_int_equal(yaml_len(command), G_N_ELEMENTS(enable));
        for (guint i = 0; i < G_N_ELEMENTS(enable); i++)
            assert_yaml_string(yaml_item(y, command, i), enable[i]);
    }
    if (has_env) {
        yaml_node_t *file = yaml_item(y, files, (has_proxy ? 3 : 0) + has_ca);

        assert_yaml_string(yaml_get(y, file, "path"), "/etc/environment");
        assert_yaml_bool(yaml_get(y, file, "append"), TRUE);
        assert_yaml_string(yaml_get(y, file, "content"), spec->environment_block);
    }
    if (spec->guest_tool) {
        yaml_node_t *file = yaml_item(y, files, yaml_len(files) - 3);

        assert_yaml_string(yaml_get(y, file, "path"), "/usr/local/bin/vmctl-guest");
        assert_yaml_string(yaml_get(y, file, "permissions"), "0755");
        assert_yaml_string(yaml_get(y, file, "content"), vm_seed_guest_tool());
    }
    yaml_node_t *packages = yaml_get(y, root, "packages");
    if (!has_packages) {
        assert_null(packages);
        return;
    }
    guint n = g_strv_length((char **)spec->packages);
    assert_int_equal(yaml_len(packages), n);
    for (guint i = 0; i < n; i++)
        assert_yaml_string(yaml_item(y, packages, i), spec->packages[i]);
}

static void
assert_meta_data_matches(const char *meta_data, const VmSeedSpec *spec)
{
    g_autoptr(YamlDoc) y = yaml_load(meta_data);
    yaml_node_t *root = yaml_document_get_root_node(&y->doc);

    assert_int_equal(yaml_len(root), 2);
    assert_yaml_string(yaml_get(y, root, "instance-id"), spec->instance_id);
    assert_yaml_string(yaml_get(y, root, "local-hostname"), spec->hostname);
}

/* Golden tests ----------------------------------------------------------------------------- */

/* @spec's user-data, which must render, checked against the golden file @golden. */
static char *
render_golden(const VmSeedSpec *spec, const char *golden)
{
    g_autoptr(GError) error = NULL;
    char *user_data = vm_seed_render_user_data(spec, &error);

    assert_null(error);
    assert_non_null(user_data);
    vm_test_assert_golden(golden, user_data);
    return user_data;
}

static void
test_golden_plain(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    g_autofree char *user_data = render_golden(&f->spec, "seed-plain-user-data.txt");
    assert_cloud_config_matches(user_data, &f->spec);

    g_autofree char *meta_data = vm_seed_render_meta_data(&f->spec, &error);
    assert_null(error);
    assert_non_null(meta_data);
    vm_test_assert_golden("seed-plain-meta-data.txt", meta_data);
    assert_meta_data_matches(meta_data, &f->spec);

    /* The empty package list is no list at all. */
    const char *const none[] = {NULL};
    f->spec.packages = none;
    g_autofree char *again = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_string_equal(again, user_data);
}

/* The warm image's seed: the template's user, no key of any kind (hostd's, the user's, a host
 * key), host keys deleted and none made, sshd masked for the boot; the rest as an agent's. */
static void
test_warm(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    f->spec.warm = TRUE;
    f->spec.authorized_key = NULL;
    f->spec.host_key_private = NULL;
    f->spec.host_key_public = NULL;
    f->spec.egress_proxy = "http://10.0.2.100:3128";
    g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_non_null(user_data);
    assert_null(strstr(user_data, "ssh-ed25519"));
    assert_null(strstr(user_data, "PRIVATE KEY"));
    assert_null(strstr(user_data, "ssh_authorized_keys"));
    assert_null(strstr(user_data, "ssh_keys"));

    g_autoptr(YamlDoc) y = yaml_load(user_data);
    yaml_node_t *root = yaml_document_get_root_node(&y->doc);
    assert_string_equal((const char *)yaml_get(y, root, "ssh_deletekeys")->data.scalar.value,
                        "true");
    assert_int_equal(yaml_len(yaml_get(y, root, "ssh_genkeytypes")), 0);
    yaml_node_t *bootcmd = yaml_get(y, root, "bootcmd");
    assert_int_equal(yaml_len(bootcmd), 1);
    /* sshd's start waits for the flag hostd's identity step creates, through a drop-in in /run
     * that the shell command writes: run that command's printf here to see the file. */
    yaml_node_t *cmd = yaml_item(y, bootcmd, 0);
    assert_int_equal(yaml_len(cmd), 3);
    assert_yaml_string(yaml_item(y, cmd, 0), "sh");
    assert_yaml_string(yaml_item(y, cmd, 1), "-c");
    yaml_node_t *script = yaml_item(y, cmd, 2);
    g_autofree char *text =
        g_strndup((const char *)script->data.scalar.value, script->data.scalar.length);
    assert_non_null(strstr(text, "systemctl daemon-reload"));
    const char *printf_at = strstr(text, "printf '");
    assert_non_null(printf_at);
    const char *end = strchr(printf_at + 8, '\'');
    g_autofree char *format = g_strndup(printf_at + 8, end - (printf_at + 8));
    const char *argv[] = {"printf", format, NULL};
    g_autofree char *dropin = NULL;
    assert_true(g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, &dropin,
                             NULL, NULL, NULL));
    assert_string_equal(dropin, "[Unit]\nConditionPathExists=" VM_SEED_WARM_IDENTITY_FLAG
                                "\n[Service]\nExecStartPre=\n");
    yaml_node_t *users = yaml_get(y, root, "users");
    assert_yaml_string(yaml_get(y, yaml_item(y, users, 0), "name"), f->spec.user);
    assert_non_null(strstr(user_data, "/etc/environment"));

    /* Keys given anyway are not used. */
    const char *const keys[] = {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUSERKEY user@laptop", NULL};
    f->spec.authorized_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHOSTD hostd";
    f->spec.user_keys = keys;
    g_autofree char *again = vm_seed_render_user_data(&f->spec, &error);
    assert_string_equal(again, user_data);

    /* An agent's seed without its keys is still refused. */
    f->spec.warm = FALSE;
    g_autofree char *refused = vm_seed_render_user_data(&f->spec, &error);
    assert_null(refused);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

static void
test_golden_packages_template(void **state)
{
    Fixture *f = *state;
    const char *const packages[] = {"git", "build-essential", "python3-venv", NULL};
    const char *template_part = "#cloud-config\n"
                                "packages:\n"
                                "  - curl\n"
                                "runcmd:\n"
                                "  - [systemctl, enable, --now, docker]\n";
    g_autoptr(GError) error = NULL;

    f->spec.packages = packages;
    f->spec.template_user_data = template_part;
    g_autofree char *user_data = render_golden(&f->spec, "seed-packages-template-user-data.txt");

    g_autoptr(GArray) parts = mime_split(user_data);
    assert_int_equal(parts->len, 2);
    MimePart *hostd = mime_part(parts, 0);
    assert_string_equal(hostd->content_type, "text/cloud-config");
    assert_null(hostd->merge_type);
    assert_cloud_config_matches(hostd->body, &f->spec);
    MimePart *tpl = mime_part(parts, 1);
    assert_string_equal(tpl->content_type, "text/cloud-config");
    assert_string_equal(tpl->merge_type, TEST_MERGE_TYPE);
    assert_string_equal(tpl->body, template_part);
    assert_string_equal(tpl->encoding, "7bit");

    /* Stable: the same input renders the same bytes (the golden file relies on it). */
    g_autofree char *again = vm_seed_render_user_data(&f->spec, &error);
    assert_string_equal(again, user_data);
}

static void
test_golden_template_script(void **state)
{
    Fixture *f = *state;
    const char *template_part = "#cloud-config\n"
                                "write_files:\n"
                                "  - path: /etc/motd\n"
                                "    content: \"agent VM\\n\"\n";
    const char *user_part = "#!/bin/bash\n"
                            "set -eu\n"
                            "echo \"hello from $(hostname)\" > /var/tmp/hello\n";

    f->spec.template_user_data = template_part;
    f->spec.user_user_data = user_part;
    g_autofree char *user_data = render_golden(&f->spec, "seed-template-script-user-data.txt");

    g_autoptr(GArray) parts = mime_split(user_data);
    assert_int_equal(parts->len, 3);
    assert_cloud_config_matches(mime_part(parts, 0)->body, &f->spec);
    assert_string_equal(mime_part(parts, 1)->content_type, "text/cloud-config");
    assert_string_equal(mime_part(parts, 1)->merge_type, TEST_MERGE_TYPE);
    assert_string_equal(mime_part(parts, 1)->body, template_part);
    MimePart *script = mime_part(parts, 2);
    assert_string_equal(script->content_type, "text/x-shellscript");
    assert_null(script->merge_type);
    assert_string_equal(script->body, user_part);
    /* cloud-init runs user scripts sorted by file name: the template's would come first. */
    assert_true(strcmp(mime_part(parts, 1)->filename, script->filename) < 0);
    assert_true(g_str_has_suffix(script->filename, ".sh"));
}

/* vmctl-guest goes to /usr/local/bin, executable, exactly as cloud-init/vmctl-guest in the source
 * tree (built in, not copied by hand); the API's address joins no_proxy, so clients in the guest
 * reach it directly, and a shell reading the profile script sees it there. */
static void
test_guest_api(void **state)
{
    Fixture *f = *state;
    g_autofree char *source =
        g_build_filename(g_getenv("VM_SOURCE_DIR") != NULL ? g_getenv("VM_SOURCE_DIR") : ".",
                         "cloud-init", "vmctl-guest", NULL);
    g_autofree char *shipped = vm_test_read_file(source);

    assert_string_equal(vm_seed_guest_tool(), shipped);
    assert_true(g_str_has_prefix(shipped, "#!/bin/bash\n"));

    f->spec.egress_proxy = "http://10.0.2.100:3128";
    f->spec.guest_api_host = "10.0.2.100";
    f->spec.guest_tool = TRUE;
    g_autoptr(GError) error = NULL;
    g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_cloud_config_matches(user_data, &f->spec);

    g_autoptr(YamlDoc) y = yaml_load(user_data);
    yaml_node_t *files = yaml_get(y, yaml_document_get_root_node(&y->doc), "write_files");
    yaml_node_t *profile = yaml_get(y, yaml_item(y, files, 1), "content");
    g_autofree char *script =
        g_strndup((const char *)profile->data.scalar.value, profile->data.scalar.length);
    g_autofree char *with_echo = g_strconcat(script, "echo \"$no_proxy\"\n", NULL);
    const char *argv[] = {"sh", "-c", with_echo, NULL};
    g_autofree char *out = NULL;
    assert_true(vm_spawn_run(argv, NULL, &out, NULL));
    assert_string_equal(out, "localhost,127.0.0.1,::1,10.0.2.100\n");

    /* Without the proxy (a fork) the tool alone; without either, no write_files at all. */
    f->spec.egress_proxy = NULL;
    g_autofree char *fork = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_cloud_config_matches(fork, &f->spec);
}

/* The credential broker's part: the agent's CA certificate in Debian's local CA directory,
 * trusted by update-ca-certificates after write_files, and the block of placeholders appended
 * to /etc/environment after the proxy's lines; with a user's part merged in, hostd's stay. */
static void
test_credential_broker(void **state)
{
    Fixture *f = *state;
    const char *ca =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
    const char *block = "# BEGIN vmctl secrets\nEXAMPLE_API_KEY=vmph_abc\n"
                        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\n# END vmctl secrets\n";
    g_autoptr(GError) error = NULL;

    f->spec.egress_proxy = "http://10.0.2.100:3128";
    f->spec.guest_tool = TRUE;
    f->spec.egress_ca_pem = ca;
    f->spec.environment_block = block;
    g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_cloud_config_matches(user_data, &f->spec);

    /* Either alone. */
    f->spec.egress_proxy = NULL;
    f->spec.guest_tool = FALSE;
    f->spec.environment_block = NULL;
    g_autofree char *ca_only = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_cloud_config_matches(ca_only, &f->spec);
    f->spec.egress_ca_pem = NULL;
    f->spec.environment_block = block;
    g_autofree char *env_only = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    assert_cloud_config_matches(env_only, &f->spec);

    /* A key, two PEM objects, or anything but a certificate never reaches the guest. */
    static const char *const bad_ca[] = {
        "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
        "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n",
        "-----BEGIN CERTIFICATE-----\nMIIB\n",
        "",
    };
    f->spec.environment_block = NULL;
    for (gsize i = 0; i < G_N_ELEMENTS(bad_ca); i++) {
        g_autoptr(GError) bad_error = NULL;

        f->spec.egress_ca_pem = bad_ca[i];
        assert_null(vm_seed_render_user_data(&f->spec, &bad_error));
        assert_true(g_error_matches(bad_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(bad_error->message, "egress_ca_pem"));
    }

    /* Lines pam_env would misread, or that are not whole lines. */
    static const char *const bad_env[] = {
        "EXAMPLE=1", "=x\n", "1X=y\n", "X y=z\n", "X=a\rb\n", "X=1\n\n", "just text\n",
    };
    f->spec.egress_ca_pem = NULL;
    for (gsize i = 0; i < G_N_ELEMENTS(bad_env); i++) {
        g_autoptr(GError) bad_error = NULL;

        f->spec.environment_block = bad_env[i];
        assert_null(vm_seed_render_user_data(&f->spec, &bad_error));
        assert_true(g_error_matches(bad_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(bad_error->message, "environment_block"));
    }
}

/* The proxy settings (and the resolver's resolv.conf) sit in hostd's part, before the extra parts,
 * so they can only be added to, and the profile script really sets them in a shell. */
static void
test_golden_egress(void **state)
{
    Fixture *f = *state;
    const char *const packages[] = {"curl", NULL};

    f->spec.egress_proxy = "http://10.0.2.100:3128";
    f->spec.egress_resolver = "10.0.2.100";
    f->spec.packages = packages;
    g_autofree char *user_data = render_golden(&f->spec, "seed-egress-user-data.txt");
    assert_cloud_config_matches(user_data, &f->spec);

    g_autoptr(YamlDoc) y = yaml_load(user_data);
    yaml_node_t *files = yaml_get(y, yaml_document_get_root_node(&y->doc), "write_files");
    yaml_node_t *profile = yaml_get(y, yaml_item(y, files, 1), "content");
    g_autofree char *script =
        g_strndup((const char *)profile->data.scalar.value, profile->data.scalar.length);
    g_autofree char *with_echo = g_strconcat(script, "echo \"$https_proxy|$NO_PROXY\"\n", NULL);
    const char *argv[] = {"sh", "-c", with_echo, NULL};
    g_autofree char *out = NULL;

    assert_true(vm_spawn_run(argv, NULL, &out, NULL));
    assert_string_equal(out, "http://10.0.2.100:3128|localhost,127.0.0.1,::1\n");
}

/* The user's own keys (vmctl new --ssh-key) follow hostd's in the user's list, each a quoted
 * scalar: a key line cannot add YAML of its own. */
static void
test_golden_user_keys(void **state)
{
    Fixture *f = *state;
    const char *const keys[] = {
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdMxvJvs++1WuNPdk7BzuRk/JXfbGBgYM5/7TFiSqkg "
        "vmctl-authorized: alice@laptop",
        "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPZ4 "
        "vmctl-authorized: \"quoted\" #not-a-comment: [x]",
        NULL,
    };
    g_autoptr(GError) error = NULL;

    f->spec.user_keys = keys;
    g_autofree char *user_data = render_golden(&f->spec, "seed-user-keys-user-data.txt");
    assert_cloud_config_matches(user_data, &f->spec);

    const char *const newline[] = {"ssh-ed25519 AAAA a\nruncmd: [reboot]", NULL};
    f->spec.user_keys = newline;
    assert_null(vm_seed_render_user_data(&f->spec, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "user key contains a control character");
    g_clear_error(&error);

    const char *const empty[] = {"", NULL};
    f->spec.user_keys = empty;
    assert_null(vm_seed_render_user_data(&f->spec, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "user key is missing");
    g_clear_error(&error);

    g_autoptr(GPtrArray) many = g_ptr_array_new();
    for (guint i = 0; i <= VM_SSH_KEYS_MAX; i++)
        g_ptr_array_add(many, (gpointer)keys[0]);
    g_ptr_array_add(many, NULL);
    f->spec.user_keys = (const char *const *)many->pdata;
    assert_null(vm_seed_render_user_data(&f->spec, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "more than 32 user keys");
}

/* Bad inputs ------------------------------------------------------------------------------- */

#define FIELD(name) offsetof(VmSeedSpec, name)
#define NO_FIELD    ((size_t)-1)

typedef struct {
    const char *what;
    size_t field; /* a const char * member of VmSeedSpec, or NO_FIELD */
    const char *value;
    const char *const *packages; /* used when field is NO_FIELD */
    const char *message;         /* part of the error message */
    gboolean meta_fails;         /* vm_seed_render_meta_data() fails too */
} BadCase;

static const char *const bad_packages_newline[] = {"git", "vim\n  - evil", NULL};
static const char *const bad_packages_empty[] = {"git", "", NULL};

static const BadCase bad_cases[] = {
    {"no hostname", FIELD(hostname), NULL, NULL, "hostname is missing", TRUE},
    {"empty hostname", FIELD(hostname), "", NULL, "hostname is missing", TRUE},
    {"newline in hostname", FIELD(hostname), "agent-1\nruncmd: [reboot]", NULL,
     "hostname contains a control character", TRUE},
    {"space in hostname", FIELD(hostname), "agent 1", NULL, "not a valid host name", TRUE},
    {"leading dash in hostname", FIELD(hostname), "-agent", NULL, "not a valid host name", TRUE},
    {"empty label in hostname", FIELD(hostname), "agent..example", NULL, "not a valid host name",
     TRUE},
    {"long label in hostname", FIELD(hostname),
     "a234567890123456789012345678901234567890123456789012345678901234", NULL,
     "not a valid host name", TRUE},
    {"non-UTF-8 hostname", FIELD(hostname), "agent\xff", NULL, "not valid UTF-8", TRUE},
    {"no instance id", FIELD(instance_id), NULL, NULL, "instance_id is missing", TRUE},
    {"newline in instance id", FIELD(instance_id), "iid\nlocal-hostname: x", NULL,
     "instance_id contains a control character", TRUE},
    {"tab in instance id", FIELD(instance_id), "iid\tx", NULL, "control character", TRUE},
    {"DEL in instance id", FIELD(instance_id), "iid\x7f", NULL, "control character", TRUE},
    {"NEL in instance id", FIELD(instance_id), "iid\xc2\x85x", NULL, "control character", TRUE},
    {"LS in instance id", FIELD(instance_id), "iid\xe2\x80\xa8x", NULL, "line break", TRUE},
    {"no user", FIELD(user), NULL, NULL, "user is missing", FALSE},
    {"upper-case user", FIELD(user), "Agent", NULL, "not a valid user name", FALSE},
    {"path in user", FIELD(user), "../x", NULL, "not a valid user name", FALSE},
    {"newline in user", FIELD(user), "agent\n", NULL, "user contains a control character", FALSE},
    {"long user", FIELD(user), "a23456789012345678901234567890123", NULL, "not a valid user name",
     FALSE},
    {"no authorized key", FIELD(authorized_key), NULL, NULL, "authorized_key is missing", FALSE},
    {"two authorized keys", FIELD(authorized_key), "ssh-ed25519 AAAA a\nssh-rsa BBBB b", NULL,
     "authorized_key contains a control character", FALSE},
    {"no private host key", FIELD(host_key_private), NULL, NULL, "host_key_private is missing",
     FALSE},
    {"private host key not PEM", FIELD(host_key_private), "AAAA\n", NULL, "not a PEM", FALSE},
    {"CRLF private host key", FIELD(host_key_private),
     "-----BEGIN OPENSSH PRIVATE KEY-----\r\nAAAA\r\n-----END OPENSSH PRIVATE KEY-----\r\n", NULL,
     "outside printable ASCII", FALSE},
    {"no public host key", FIELD(host_key_public), NULL, NULL, "host_key_public is missing", FALSE},
    {"RSA public host key", FIELD(host_key_public), "ssh-rsa AAAAB3NzaC1yc2E", NULL,
     "not an ssh-ed25519", FALSE},
    {"newline in public host key", FIELD(host_key_public), "ssh-ed25519 AAAA\nx: y", NULL,
     "host_key_public contains a control character", FALSE},
    {"newline in a package", NO_FIELD, NULL, bad_packages_newline,
     "package name contains a control character", FALSE},
    {"empty package", NO_FIELD, NULL, bad_packages_empty, "package name is missing", FALSE},
    {"template without header", FIELD(template_user_data), "packages: [git]\n", NULL,
     "template user-data must start with #cloud-config or #!", FALSE},
    {"empty template", FIELD(template_user_data), "", NULL,
     "template user-data must start with #cloud-config or #!", FALSE},
    {"user-data without header", FIELD(user_user_data), "echo hello\n", NULL,
     "user-data must start with #cloud-config or #!", FALSE},
    {"user-data with indented header", FIELD(user_user_data), "  #!/bin/sh\n", NULL,
     "user-data must start with #cloud-config or #!", FALSE},
    {"cloud-config-archive", FIELD(user_user_data), "#cloud-config-archive\n- type: x\n", NULL,
     "user-data must start with #cloud-config or #!", FALSE},
    {"jinja template", FIELD(user_user_data), "## template: jinja\n#cloud-config\n", NULL,
     "user-data must start with #cloud-config or #!", FALSE},
    {"user-data sets merge_how", FIELD(user_user_data),
     "#cloud-config\nmerge_how: 'dict(replace)+list(replace)'\nusers: []\n", NULL,
     "must not set merge_how or merge_type", FALSE},
    {"user-data sets merge_type", FIELD(user_user_data),
     "#cloud-config\n\"merge_type\": dict(replace)\n", NULL, "must not set merge_how or merge_type",
     FALSE},
    {"non-UTF-8 user-data", FIELD(user_user_data), "#!/bin/sh\necho \xc3\x28\n", NULL,
     "not valid UTF-8", FALSE},
    {"empty proxy", FIELD(egress_proxy), "", NULL, "egress_proxy is missing", FALSE},
    {"resolver not an address", FIELD(egress_resolver), "resolver.example", NULL,
     "egress_resolver 'resolver.example' is not an IPv4 address", FALSE},
    {"resolver with a newline", FIELD(egress_resolver), "10.0.2.100\noptions x", NULL,
     "is not an IPv4 address", FALSE},
    {"https proxy", FIELD(egress_proxy), "https://10.0.2.100:3128", NULL, "not http://HOST", FALSE},
    {"proxy without host", FIELD(egress_proxy), "http://", NULL, "not http://HOST", FALSE},
    {"proxy with a quote", FIELD(egress_proxy), "http://a\";x", NULL, "not http://HOST", FALSE},
    {"proxy with a space", FIELD(egress_proxy), "http://a b", NULL, "not http://HOST", FALSE},
    {"proxy with shell", FIELD(egress_proxy), "http://$(reboot)", NULL, "not http://HOST", FALSE},
    {"proxy with a path", FIELD(egress_proxy), "http://a/x", NULL, "not http://HOST", FALSE},
    {"proxy with userinfo", FIELD(egress_proxy), "http://u:p@a", NULL, "not http://HOST", FALSE},
    {"proxy with empty port", FIELD(egress_proxy), "http://a:", NULL, "not http://HOST", FALSE},
    {"proxy with long port", FIELD(egress_proxy), "http://a:123456", NULL, "not http://HOST",
     FALSE},
    {"proxy with a newline", FIELD(egress_proxy), "http://a\nruncmd: [x]", NULL,
     "egress_proxy contains a control character", FALSE},
    {"empty API host", FIELD(guest_api_host), "", NULL, "not a host name", FALSE},
    {"API host with a comma", FIELD(guest_api_host), "a,b", NULL, "not a host name", FALSE},
    {"API host with a newline", FIELD(guest_api_host), "a\nruncmd: [x]", NULL, "not a host name",
     FALSE},
    {"API host with a port", FIELD(guest_api_host), "10.0.2.100:80", NULL, "not a host name",
     FALSE},
};

static void
test_bad_inputs(void **state)
{
    Fixture *f = *state;

    for (size_t i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        const BadCase *c = &bad_cases[i];
        VmSeedSpec spec = f->spec;
        g_autoptr(GError) error = NULL;
        g_autoptr(GError) meta_error = NULL;
        g_autoptr(GError) iso_error = NULL;

        print_message("# bad input: %s\n", c->what);
        if (c->field != NO_FIELD)
            *(const char **)((char *)&spec + c->field) = c->value;
        else
            spec.packages = c->packages;

        g_autofree char *user_data = vm_seed_render_user_data(&spec, &error);
        assert_null(user_data);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, c->message);

        g_autofree char *meta_data = vm_seed_render_meta_data(&spec, &meta_error);
        if (c->meta_fails) {
            assert_null(meta_data);
            vm_test_assert_error(meta_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, c->message);
        } else {
            assert_non_null(meta_data);
            assert_null(meta_error);
        }

        g_autofree char *iso = g_build_filename(f->dir, "seed.iso", NULL);
        assert_false(vm_seed_write_iso(&spec, iso, &iso_error));
        vm_test_assert_error(iso_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, c->message);
        assert_int_equal(vm_test_count_entries(f->dir), 0);
    }
}

static void
test_part_size_limit(void **state)
{
    Fixture *f = *state;
    const size_t max = VM_USER_DATA_MAX;
    g_autofree char *part = g_malloc(max + 2);

    /* A script of exactly the limit passes; one byte more does not, in either slot. */
    memset(part, 'x', max + 1);
    memcpy(part, "#!/bin/sh\n", 10);
    for (size_t i = 80; i < max; i += 80)
        part[i] = '\n';
    part[max] = '\0';

    g_autoptr(GError) error = NULL;
    f->spec.user_user_data = part;
    g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);
    g_autoptr(GArray) parts = mime_split(user_data);
    assert_string_equal(mime_part(parts, 1)->body, part);

    part[max] = 'x';
    part[max + 1] = '\0';
    g_autofree char *too_big = vm_seed_render_user_data(&f->spec, &error);
    assert_null(too_big);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "user-data is 65537 bytes, more than");
    g_clear_error(&error);

    f->spec.user_user_data = NULL;
    f->spec.template_user_data = part;
    g_autofree char *too_big_template = vm_seed_render_user_data(&f->spec, &error);
    assert_null(too_big_template);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "template user-data is 65537 bytes");
}

/* Good inputs that look odd ---------------------------------------------------------------- */

static void
test_good_inputs(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *what;
        size_t field;
        const char *value;
    } cases[] = {
        {"dotted hostname", FIELD(hostname), "agent-1.vm.example"},
        {"upper-case hostname", FIELD(hostname), "Agent-1"},
        {"underscore user", FIELD(user), "_agent"},
        {"machine user", FIELD(user), "build$"},
        {"header with trailing blanks and CRLF", FIELD(user_user_data),
         "#cloud-config  \r\nruncmd:\r\n  - [true]\r\n"},
        {"header only", FIELD(template_user_data), "#cloud-config"},
        {"script without final newline", FIELD(user_user_data), "#!/bin/sh\ntrue"},
        {"python script", FIELD(user_user_data), "#!/usr/bin/env python3\nprint('hi')\n"},
        {"merge_how only inside a value", FIELD(user_user_data),
         "#cloud-config\nruncmd:\n  - echo merge_how: x\n"},
    };

    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        VmSeedSpec spec = f->spec;
        g_autoptr(GError) error = NULL;

        print_message("# good input: %s\n", cases[i].what);
        *(const char **)((char *)&spec + cases[i].field) = cases[i].value;
        g_autofree char *user_data = vm_seed_render_user_data(&spec, &error);
        assert_null(error);
        assert_non_null(user_data);
        if (spec.template_user_data == NULL && spec.user_user_data == NULL) {
            assert_cloud_config_matches(user_data, &spec);
        } else {
            g_autoptr(GArray) parts = mime_split(user_data);
            assert_int_equal(parts->len, 2);
            assert_cloud_config_matches(mime_part(parts, 0)->body, &spec);
            assert_string_equal(mime_part(parts, 1)->body, cases[i].value);
        }
    }
}

/* YAML quoting ----------------------------------------------------------------------------- */

static void
test_yaml_roundtrip(void **state)
{
    Fixture *f = *state;
    static const char *const packages[] = {
        "yes",          "null",        "~",      "1.0",    "- a",     "a: b",
        "[x]",          "{y}",         "#z",     "*alias", "&anchor", "!tag",
        "%dir",         "@at",         "`tick",  "|",      ">",       "'single'",
        "\"double\"",   "back\\slash", "--- ",   "...",    "?q",      "tr\xc3\xa9ma",
        "\xe2\x9c\x93", " lead",       "trail ", NULL,
    };
    static const char *const private_keys[] = {
        TEST_PRIVATE_KEY,
        /* no final newline */
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
        /* several final newlines, a blank line and trailing blanks inside */
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA  \n\n  BBBB\n-----END OPENSSH PRIVATE "
        "KEY-----\n\n\n",
    };
    g_autoptr(GError) error = NULL;

    f->spec.instance_id = "iid: \"quoted\" \\ #hash 'single' - *star &amp !tag %pct \xe2\x9c\x93";
    f->spec.authorized_key = "ssh-ed25519 AAAAC3Nza key: \"comment\" # with 'quotes' \\";
    f->spec.packages = packages;

    for (size_t i = 0; i < G_N_ELEMENTS(private_keys); i++) {
        f->spec.host_key_private = private_keys[i];
        g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
        assert_null(error);
        assert_non_null(user_data);
        assert_cloud_config_matches(user_data, &f->spec);
    }

    g_autofree char *meta_data = vm_seed_render_meta_data(&f->spec, &error);
    assert_null(error);
    assert_meta_data_matches(meta_data, &f->spec);
}

/* MIME ------------------------------------------------------------------------------------- */

static void
test_mime_encoding(void **state)
{
    Fixture *f = *state;
    /* Non-ASCII must go out base64: Python's email parser (cloud-init's) mangles it unencoded. */
    const char *template_part = "#cloud-config\n"
                                "write_files:\n"
                                "  - path: /etc/motd\n"
                                "    content: \"Gr\xc3\xbc\xc3\x9f \xe2\x9c\x93\\n\"\n";
    const char *user_part = "#!/bin/sh\n"
                            "# a line that looks like a delimiter must stay in the body\n"
                            "echo '--==vmctl-seed-0==--'\n"
                            "echo 'no final newline'";
    g_autoptr(GError) error = NULL;

    f->spec.template_user_data = template_part;
    f->spec.user_user_data = user_part;
    g_autofree char *user_data = vm_seed_render_user_data(&f->spec, &error);
    assert_null(error);

    g_autoptr(GArray) parts = mime_split(user_data);
    assert_int_equal(parts->len, 3);
    assert_string_equal(mime_part(parts, 0)->encoding, "7bit");
    assert_string_equal(mime_part(parts, 1)->encoding, "base64");
    assert_string_equal(mime_part(parts, 1)->body, template_part);
    assert_string_equal(mime_part(parts, 2)->encoding, "7bit");
    assert_string_equal(mime_part(parts, 2)->body, user_part);

    g_autofree char *hostd_body = vm_seed_render_user_data(
        &(VmSeedSpec){
            .hostname = f->spec.hostname,
            .instance_id = f->spec.instance_id,
            .user = f->spec.user,
            .authorized_key = f->spec.authorized_key,
            .host_key_private = f->spec.host_key_private,
            .host_key_public = f->spec.host_key_public,
        },
        &error);
    assert_null(error);
    /* The first part is hostd's document, the very one rendered without extra parts. */
    assert_string_equal(mime_part(parts, 0)->body, hostd_body);

    const char *types[] = {"text/cloud-config", "text/cloud-config", "text/x-shellscript"};
    const char *merges[] = {NULL, TEST_MERGE_TYPE, NULL};
    const char *bodies[] = {hostd_body, template_part, user_part};
    check_with_python(f->dir, user_data, types, merges, bodies, 3);
}

/* ISO -------------------------------------------------------------------------------------- */

static gboolean
have_iso_tools(void)
{
    g_autofree char *geniso = g_find_program_in_path("genisoimage");
    g_autofree char *isoinfo = g_find_program_in_path("isoinfo");

    return geniso != NULL && isoinfo != NULL;
}

static char *
run_isoinfo(const char *const *args)
{
    g_autoptr(GPtrArray) argv = g_ptr_array_new();
    g_autofree char *out = NULL;
    g_autoptr(GError) error = NULL;

    g_ptr_array_add(argv, (char *)"isoinfo");
    for (const char *const *a = args; *a != NULL; a++)
        g_ptr_array_add(argv, (char *)*a);
    g_ptr_array_add(argv, NULL);
    if (!vm_spawn_run((const char *const *)argv->pdata, NULL, &out, &error)) {
        print_error("%s\n", error->message);
        fail();
    }
    return g_steal_pointer(&out);
}

static void
assert_iso_holds(const char *iso, const VmSeedSpec *spec)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *user_data = vm_seed_render_user_data(spec, &error);
    g_autofree char *meta_data = vm_seed_render_meta_data(spec, &error);
    assert_null(error);

    g_autofree char *info = run_isoinfo((const char *[]){"-d", "-i", iso, NULL});
    assert_non_null(strstr(info, "\nVolume id: cidata\n"));
    assert_non_null(strstr(info, "Joliet"));
    assert_non_null(strstr(info, "Rock Ridge"));

    g_autofree char *got_user =
        run_isoinfo((const char *[]){"-i", iso, "-J", "-x", "/user-data", NULL});
    assert_string_equal(got_user, user_data);
    g_autofree char *got_meta =
        run_isoinfo((const char *[]){"-i", iso, "-J", "-x", "/meta-data", NULL});
    assert_string_equal(got_meta, meta_data);

    /* What the guest sees when it mounts the ISO (Rock Ridge): two files, mode 0644. */
    g_autofree char *listing = run_isoinfo((const char *[]){"-i", iso, "-R", "-l", NULL});
    g_auto(GStrv) lines = g_strsplit(listing, "\n", -1);
    guint files = 0;
    for (char **line = lines; *line != NULL; line++) {
        if (g_str_has_suffix(*line, " user-data ") || g_str_has_suffix(*line, " meta-data ")) {
            assert_true(g_str_has_prefix(*line, "-rw-r--r--"));
            files++;
        } else if (g_str_has_prefix(*line, "-")) {
            print_error("unexpected file in the ISO: %s\n", *line);
            fail();
        }
    }
    assert_int_equal(files, 2);
}

static void
test_iso(void **state)
{
    Fixture *f = *state;
    g_autofree char *iso = g_build_filename(f->dir, "seed.iso", NULL);
    g_autoptr(GError) error = NULL;
    struct stat st;

    if (!have_iso_tools())
        skip();

    f->spec.template_user_data = "#cloud-config\npackages: [curl]\n";
    assert_true(vm_seed_write_iso(&f->spec, iso, &error));
    assert_null(error);
    assert_iso_holds(iso, &f->spec);
    /* It holds the guest's private host key. */
    assert_int_equal(g_stat(iso, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);

    /* Rewriting replaces it whole, and leaves nothing behind, here or in $TMPDIR. */
    f->spec.hostname = "agent-2";
    f->spec.template_user_data = NULL;
    assert_true(vm_seed_write_iso(&f->spec, iso, &error));
    assert_null(error);
    assert_iso_holds(iso, &f->spec);
    assert_int_equal(vm_test_count_entries(f->dir), 1);
    assert_int_equal(vm_test_count_entries(test_tmp_root), 1); /* the fixture's own directory */
}

static void
test_iso_failures(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    if (!have_iso_tools())
        skip();

    g_autofree char *missing = g_build_filename(f->dir, "no-such-dir", "seed.iso", NULL);
    assert_false(vm_seed_write_iso(&f->spec, missing, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot create a file next to");
    g_clear_error(&error);
    assert_int_equal(vm_test_count_entries(test_tmp_root), 1);

    /* genisoimage fails: its stderr is the message, and no half-written ISO is left. */
    g_autofree char *bin = g_build_filename(f->dir, "bin", NULL);
    g_autofree char *fake = g_build_filename(bin, "genisoimage", NULL);
    assert_int_equal(g_mkdir(bin, 0700), 0);
    assert_true(g_file_set_contents(fake,
                                    "#!/bin/sh\n"
                                    "echo 'partial' > \"$3\"\n"
                                    "echo 'genisoimage: simulated disk full' >&2\n"
                                    "exit 3\n",
                                    -1, NULL));
    assert_int_equal(g_chmod(fake, 0755), 0);

    g_autofree char *saved_path = g_strdup(g_getenv("PATH"));
    g_autofree char *out_dir = g_build_filename(f->dir, "out", NULL);
    g_autofree char *iso = g_build_filename(out_dir, "seed.iso", NULL);
    assert_int_equal(g_mkdir(out_dir, 0700), 0);

    g_setenv("PATH", bin, TRUE);
    gboolean ok = vm_seed_write_iso(&f->spec, iso, &error);
    g_setenv("PATH", f->dir, TRUE); /* no genisoimage at all */
    g_autoptr(GError) spawn_error = NULL;
    gboolean ok2 = vm_seed_write_iso(&f->spec, iso, &spawn_error);
    g_setenv("PATH", saved_path, TRUE);

    assert_false(ok);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "genisoimage: simulated disk full");
    assert_false(ok2);
    vm_test_assert_error(spawn_error, VM_ERROR, VM_ERROR_IO, "cannot run genisoimage");
    assert_int_equal(vm_test_count_entries(out_dir), 0);
    assert_int_equal(vm_test_count_entries(test_tmp_root), 1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_golden_plain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_warm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_packages_template, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_template_script, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_egress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credential_broker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_user_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_guest_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_size_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_good_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_yaml_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mime_encoding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_iso, setup, teardown),
        cmocka_unit_test_setup_teardown(test_iso_failures, setup, teardown),
    };

    /* A private $TMPDIR, set before GLib caches it, shows that the seed's scratch directory is
     * always removed. */
    g_autofree char *root = g_strdup("/tmp/test-seed-XXXXXX");
    if (g_mkdtemp(root) == NULL)
        return 1;
    g_setenv("TMPDIR", root, TRUE);
    test_tmp_root = root;

    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    vm_test_remove_tree(root);
    return failed;
}
