/* The SNI of a ClientHello: real GnuTLS ClientHellos whole, cut short, split across records and
 * spoilt; what is not a ClientHello fails at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-tls.h"
#include "vm-error.h"
#include "test-common.h"
#include "test-egress-fixture.h"

#include <string.h>

static VmEgressHelloStatus
sni_of(const guint8 *data, gsize len, char **ret_sni)
{
    g_autoptr(GError) error = NULL;
    VmEgressHelloStatus status = vm_egress_tls_client_hello_sni(data, len, ret_sni, &error);

    if (status == VM_EGRESS_HELLO_ERROR)
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    else
        assert_null(error);
    return status;
}

static void
test_sni_found(void **state)
{
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("Sink.Example");
    g_autoptr(GBytes) none = vm_test_tls_client_hello(NULL);
    gsize len;
    const guint8 *data = g_bytes_get_data(hello, &len);
    g_autofree char *sni = NULL;
    char *nothing = NULL;

    assert_int_equal(sni_of(data, len, &sni), VM_EGRESS_HELLO_DONE);
    assert_string_equal(sni, "Sink.Example");
    /* every prefix is incomplete, never an error */
    for (gsize i = 0; i < len; i++) {
        char *early = NULL;

        if (sni_of(data, i, &early) != VM_EGRESS_HELLO_MORE)
            fail_msg("prefix of %zu bytes is not MORE", i);
    }
    data = g_bytes_get_data(none, &len);
    assert_int_equal(sni_of(data, len, &nothing), VM_EGRESS_HELLO_DONE);
    assert_null(nothing);
}

/* The same ClientHello cut into records of @size bytes of handshake each. */
static GByteArray *
resplit(GBytes *hello, gsize size)
{
    gsize len;
    const guint8 *data = g_bytes_get_data(hello, &len);
    GByteArray *out = g_byte_array_new();
    gsize body = len - 5;

    for (gsize off = 0; off < body; off += size) {
        gsize n = MIN(size, body - off);
        guint8 header[5] = {data[0], data[1], data[2], (guint8)(n >> 8), (guint8)n};

        g_byte_array_append(out, header, 5);
        g_byte_array_append(out, data + 5 + off, n);
    }
    return out;
}

static void
test_sni_across_records(void **state)
{
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("split.example");
    static const gsize sizes[] = {1, 3, 4, 100};

    for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++) {
        g_autoptr(GByteArray) split = resplit(hello, sizes[i]);
        g_autofree char *sni = NULL;

        assert_int_equal(sni_of(split->data, split->len, &sni), VM_EGRESS_HELLO_DONE);
        assert_string_equal(sni, "split.example");
    }
}

static void
test_not_a_client_hello(void **state)
{
    static const struct {
        const char *data;
        gsize len;
    } cases[] = {
        {"GET / HTTP/1.1\r\n", 16},
        {"SSH-2.0-x\r\n", 11},
        {"\x17\x03\x03\x00\x05hello", 10},           /* application data */
        {"\x16\x02\x01\x00\x05", 5},                 /* not TLS 1.x */
        {"\x16\x03\x01\x00\x00", 5},                 /* empty record */
        {"\x16\x03\x01\x40\x01", 5},                 /* record over 2^14 */
        {"\x16\x03\x01\x00\x04\x02\x00\x00\x00", 9}, /* a ServerHello */
        {"\x16\x03\x01\x00\x04\x01\x01\x00\x00", 9}, /* a ClientHello of 64 KiB */
        /* a ClientHello whose body GnuTLS refuses */
        {"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x05\x05\x00\x00", 13},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *sni = NULL;

        if (sni_of((const guint8 *)cases[i].data, cases[i].len, &sni) != VM_EGRESS_HELLO_ERROR)
            fail_msg("case %zu accepted", i);
        assert_null(sni);
    }
}

/* A server_name extension that is not exactly one host name of printable ASCII is refused. */
static void
test_bad_server_name(void **state)
{
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("bad.example");
    gsize len;
    const guint8 *data = g_bytes_get_data(hello, &len);
    const guint8 *name = memmem(data, len, "bad.example", 11);
    gsize at;

    assert_non_null(name);
    at = name - data;
    for (int i = 0; i < 3; i++) {
        g_autofree guint8 *copy = g_memdup2(data, len);
        char *sni = NULL;

        if (i == 0)
            copy[at - 3] = 1; /* name type other than host_name */
        else if (i == 1)
            copy[at] = 0; /* NUL in the name */
        else
            copy[at + 3] = 0x80; /* not ASCII */
        if (sni_of(copy, len, &sni) != VM_EGRESS_HELLO_ERROR)
            fail_msg("case %d accepted as '%s'", i, sni);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sni_found),
        cmocka_unit_test(test_sni_across_records),
        cmocka_unit_test(test_not_a_client_hello),
        cmocka_unit_test(test_bad_server_name),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
