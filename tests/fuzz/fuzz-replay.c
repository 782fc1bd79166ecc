/* Replays a fuzz corpus without libFuzzer: runs LLVMFuzzerTestOneInput once per file named on
 * the command line (or per file in a named directory), printing TAP. A crash or a failed
 * assertion inside the target fails the test. */
#include <glib.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
replay_file(const char *path, int *n)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *contents = NULL;
    gsize len = 0;

    *n += 1;
    if (!g_file_get_contents(path, &contents, &len, &error)) {
        printf("not ok %d - %s: %s\n", *n, path, error->message);
        return 1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)contents, len);
    printf("ok %d - %s\n", *n, path);
    return 0;
}

int
main(int argc, char **argv)
{
    int failed = 0, n = 0;

    for (int i = 1; i < argc; i++) {
        g_autoptr(GDir) dir = g_dir_open(argv[i], 0, NULL);
        const char *name;

        if (dir == NULL) {
            failed |= replay_file(argv[i], &n);
            continue;
        }
        while ((name = g_dir_read_name(dir)) != NULL) {
            g_autofree char *path = g_build_filename(argv[i], name, NULL);
            failed |= replay_file(path, &n);
        }
    }
    printf("1..%d\n", n);
    return failed;
}
