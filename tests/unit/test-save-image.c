/* libvirt's save image header: a warm image's copy carries another domain XML, the same cookie
 * and a byte-identical stream at the same offset; hostile or foreign headers are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include <glib/gstdio.h>

#include "vm-error.h"
#include "vm-save-image.h"
#include "test-common.h"

typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

#define HEADER_LEN 92
#define DATA_LEN   (64 * 1024)

typedef struct {
    const char *magic;
    guint32 version;
    guint32 data_len;
    guint32 compressed;
    guint32 cookie_offset;
    const char *xml;
    const char *cookie;
    gsize stream_len;
} Spec;

/* The stream: bytes that differ at every offset, so a shift or a lost block shows. */
static guint8
stream_byte(gsize i)
{
    return (guint8)((i * 131u + (i >> 9)) & 0xff);
}

static char *
write_image(Fixture *f, const char *name, const Spec *s)
{
    g_autoptr(GByteArray) b = g_byte_array_new();
    guint32 words[19] = {s->version, s->data_len, 1, s->compressed, s->cookie_offset};
    g_byte_array_append(b, (const guint8 *)s->magic, 16);
    g_byte_array_append(b, (const guint8 *)words, sizeof(words));
    g_assert_cmpuint(b->len, ==, HEADER_LEN);
    g_autofree guint8 *data = g_malloc0(s->data_len);
    gsize xml_len = strlen(s->xml) + 1;
    memcpy(data, s->xml, MIN(xml_len, s->data_len));
    if (s->cookie != NULL && s->cookie_offset + strlen(s->cookie) + 1 <= s->data_len)
        memcpy(data + s->cookie_offset, s->cookie, strlen(s->cookie) + 1);
    g_byte_array_append(b, data, s->data_len);
    for (gsize i = 0; i < s->stream_len; i++) {
        guint8 c = stream_byte(i);
        g_byte_array_append(b, &c, 1);
    }
    char *path = g_build_filename(f->dir, name, NULL);
    g_assert_true(g_file_set_contents(path, (const char *)b->data, b->len, NULL));
    return path;
}

static Spec
good_spec(void)
{
    static const char xml[] = "<domain type='qemu'><name>warm</name></domain>\n";
    return (Spec){
        .magic = VM_SAVE_IMAGE_MAGIC,
        .version = VM_SAVE_IMAGE_VERSION,
        .data_len = DATA_LEN,
        .cookie_offset = sizeof(xml),
        .xml = xml,
        .cookie = "<cookie><cpu mode='custom'/></cookie>\n",
        .stream_len = 3 * 1024 * 1024 + 17,
    };
}

static void
test_copy_rewrites_xml_keeps_stream(void **state)
{
    Fixture *f = *state;
    Spec s = good_spec();
    g_autofree char *src = write_image(f, "warm.save", &s);
    g_autofree char *dest = g_build_filename(f->dir, "agent.save", NULL);
    const char *xml = "<domain type='qemu'><name>agent-a</name><uuid>x</uuid></domain>\n";
    g_autoptr(GError) error = NULL;

    assert_true(vm_save_image_copy_with_xml(src, dest, xml, &error));
    assert_null(error);

    g_autofree char *got_xml = vm_save_image_read_xml(dest, &error);
    assert_non_null(got_xml);
    assert_string_equal(got_xml, xml);

    g_autofree char *bytes = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(dest, &bytes, &len, NULL));
    assert_int_equal(len, HEADER_LEN + DATA_LEN + s.stream_len);
    /* The cookie follows the new XML, and the header says where. */
    guint32 words[19];
    memcpy(words, bytes + 16, sizeof(words));
    assert_int_equal(words[1], DATA_LEN);
    assert_int_equal(words[4], strlen(xml) + 1);
    assert_string_equal(bytes + HEADER_LEN + words[4], s.cookie);
    for (gsize i = 0; i < s.stream_len; i++) {
        if ((guint8)bytes[HEADER_LEN + DATA_LEN + i] != stream_byte(i))
            fail_msg("stream byte %zu differs", i);
    }
    GStatBuf st;
    assert_int_equal(g_stat(dest, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* The source is untouched. */
    g_autofree char *src_xml = vm_save_image_read_xml(src, &error);
    assert_string_equal(src_xml, s.xml);
}

static void
test_copy_without_cookie(void **state)
{
    Fixture *f = *state;
    Spec s = good_spec();
    s.cookie = NULL;
    s.cookie_offset = 0;
    g_autofree char *src = write_image(f, "warm.save", &s);
    g_autofree char *dest = g_build_filename(f->dir, "agent.save", NULL);
    g_autoptr(GError) error = NULL;

    assert_true(vm_save_image_copy_with_xml(src, dest, "<domain/>", &error));
    g_autofree char *xml = vm_save_image_read_xml(dest, &error);
    assert_string_equal(xml, "<domain/>");
}

static void
test_xml_too_big_refused(void **state)
{
    Fixture *f = *state;
    Spec s = good_spec();
    g_autofree char *src = write_image(f, "warm.save", &s);
    g_autofree char *dest = g_build_filename(f->dir, "agent.save", NULL);
    g_autofree char *big = g_strnfill(DATA_LEN, 'x');
    g_autoptr(GError) error = NULL;

    assert_false(vm_save_image_copy_with_xml(src, dest, big, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_non_null(strstr(error->message, "does not fit"));
    assert_false(g_file_test(dest, G_FILE_TEST_EXISTS));
}

/* Each header a save image must not have: refused with a clear error, no copy left. */
static void
test_bad_headers_refused(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *what;
        const char *magic;
        guint32 version, compressed, data_len, cookie_offset;
        const char *xml;
        const char *message;
    } cases[] = {
        {"partial", "LibvirtQemudPart", 0, 0, 0, 0, NULL, "not a complete save image"},
        {"version", NULL, 3, 0, 0, 0, NULL, "version"},
        {"compressed", NULL, 0, 1, 0, 0, NULL, "compressed"},
        {"data_len past the end", NULL, 0, 0, DATA_LEN + 8192, 0, NULL, "bad data length"},
        {"data_len huge", NULL, 0, 0, G_MAXUINT32, 0, NULL, "bad data length"},
        {"cookie past data", NULL, 0, 0, 0, DATA_LEN + 1, NULL, "bad cookie offset"},
        {"cookie inside xml", NULL, 0, 0, 0, 3, NULL, "bad cookie offset"},
        {"no xml", NULL, 0, 0, 0, 0, "", "no domain XML"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        Spec s = good_spec();
        s.stream_len = 4096;
        if (cases[i].magic != NULL)
            s.magic = cases[i].magic;
        if (cases[i].version != 0)
            s.version = cases[i].version;
        s.compressed = cases[i].compressed;
        if (cases[i].cookie_offset != 0)
            s.cookie_offset = cases[i].cookie_offset;
        if (cases[i].xml != NULL) {
            s.xml = cases[i].xml;
            s.cookie = NULL;
            s.cookie_offset = 0;
        }
        if (cases[i].data_len != 0) {
            /* The header claims more data than the file has. */
            g_autofree char *src = write_image(f, "bad.save", &s);
            g_autofree char *bytes = NULL;
            gsize len = 0;
            assert_true(g_file_get_contents(src, &bytes, &len, NULL));
            memcpy(bytes + 20, &cases[i].data_len, 4);
            assert_true(g_file_set_contents(src, bytes, (gssize)len, NULL));
        } else {
            g_autofree char *src = write_image(f, "bad.save", &s);
        }
        g_autofree char *src = g_build_filename(f->dir, "bad.save", NULL);
        g_autofree char *dest = g_build_filename(f->dir, "agent.save", NULL);
        g_autoptr(GError) error = NULL;
        g_autoptr(GError) read_error = NULL;
        if (vm_save_image_copy_with_xml(src, dest, "<domain/>", &error))
            fail_msg("%s: accepted", cases[i].what);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        if (strstr(error->message, cases[i].message) == NULL)
            fail_msg("%s: '%s' does not say '%s'", cases[i].what, error->message, cases[i].message);
        assert_false(g_file_test(dest, G_FILE_TEST_EXISTS));
        g_autofree char *xml = vm_save_image_read_xml(src, &read_error);
        assert_null(xml);
        assert_non_null(read_error);
    }
}

static void
test_truncated_and_missing(void **state)
{
    Fixture *f = *state;
    Spec s = good_spec();
    g_autofree char *src = write_image(f, "warm.save", &s);
    g_autofree char *bytes = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(src, &bytes, &len, NULL));
    /* Cut inside the header, then inside the data area. */
    gsize cuts[] = {0, 10, HEADER_LEN - 1, HEADER_LEN + 100};
    for (gsize i = 0; i < G_N_ELEMENTS(cuts); i++) {
        g_autofree char *cut = g_build_filename(f->dir, "cut.save", NULL);
        assert_true(g_file_set_contents(cut, bytes, (gssize)cuts[i], NULL));
        g_autoptr(GError) error = NULL;
        g_autofree char *xml = vm_save_image_read_xml(cut, &error);
        assert_null(xml);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
    g_autoptr(GError) error = NULL;
    g_autofree char *missing = g_build_filename(f->dir, "none.save", NULL);
    g_autofree char *dest = g_build_filename(f->dir, "agent.save", NULL);
    assert_false(vm_save_image_copy_with_xml(missing, dest, "<domain/>", &error));
    assert_non_null(error);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_copy_rewrites_xml_keeps_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_without_cookie, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xml_too_big_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_and_missing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
