/* hostd over libvirt's test driver, for the unit tests of hostd's components (checkpoint, fork,
 * power, egress) and of its request handling: one function builds the HostdContext
 * (hostd_test_fixture_new_full()), the rest make agents as hostd would have made them, talk to
 * hostd_server_serve_fd(), and stand in for what the test driver lacks:
 *
 * - qemu-img: a shell script first on PATH that keeps a tiny model of qcow2 backing chains. Its
 *   "images" are text files ("fake-qcow2" and "backing=PATH"); create, rebase and
 *   info --backing-chain work on them as the real one does on images, every call is logged, and
 *   chosen calls can be made to fail.
 * - QEMU's block layer (libvirt calls the test driver refuses): external disk-only and memory
 *   snapshots, the live block pull and commit, pointing a saved state at another disk. These
 *   act on the fake images and are recorded.
 * - a guest: the guest agent's freeze (off by default: it does not answer), an idle guest CPU,
 *   the clock set, a saved state that no longer loads.
 *
 * Every helper fails the running test (cmocka's fail_msg) rather than returning an error. */
#pragma once

#include <glib.h>

#include "hostd-agent.h"
#include "hostd-resources.h"
#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-protocol.h"

G_BEGIN_DECLS

typedef struct {
    char *dir;           /* temporary root of everything below */
    char *uri;           /* test:///.../node.xml: a fresh libvirt instance per fixture */
    char *templates_dir; /* a copy of the shipped debian-12.yaml, and nothing else */
    char *images_dir;    /* debian-12's image, ready (fake files), unless HOSTD_TEST_NO_IMAGE */
    char *base_image;    /* its base.qcow2; NULL with HOSTD_TEST_NO_IMAGE */
    char *bin_dir;       /* the fake qemu-img, first on PATH while the fixture lives */
    char *agents_dir;
    char *saved_path; /* PATH before the fixture */
    HostdContext *ctx;
} HostdTestFixture;

typedef enum {
    HOSTD_TEST_NO_IMAGE = 1 << 0, /* the images dir stays empty: no image is ready */
} HostdTestFixtureFlags;

/* A fresh temporary state dir, a fresh test driver instance, its own templates dir,
 * debian-12's image ready (unless @flags has HOSTD_TEST_NO_IMAGE), the fake qemu-img on PATH,
 * the fakes reset and the context's log captured. The one place that builds a HostdContext for
 * the unit tests. */
HostdTestFixture *hostd_test_fixture_new_full(HostdTestFixtureFlags flags);

/* hostd_test_fixture_new_full() with no flags. */
HostdTestFixture *hostd_test_fixture_new(void);

/* Stops the idle loop if started, frees the context, restores PATH and removes the directory. */
void hostd_test_fixture_free(HostdTestFixture *f);

/* cmocka setup and teardown around the two above. */
int hostd_test_setup(void **state);
int hostd_test_teardown(void **state);

typedef enum {
    HOSTD_TEST_STOPPED,
    HOSTD_TEST_RUNNING,
    HOSTD_TEST_PAUSED,
    HOSTD_TEST_SAVED, /* managed save */
} HostdTestState;

/* Makes the record of a ready agent, saved in its directory, and nothing else (no disk, no
 * domain): template debian-12, 1 CPU, 128 MiB, 8 GiB, a public and a backend port (recorded,
 * never bound), created a day ago, no idle or periodic checkpoint policy. Returns the record. */
HostdAgentRecord *hostd_test_agent_record_new(HostdTestFixture *f, const char *name);

/* Makes a ready agent as `new` leaves it, without keys or seed: its record
 * (hostd_test_agent_record_new()), disk.qcow2 on the base image, its domain defined from the XML
 * hostd builds (saved as domain.xml too) and brought to @state. Returns the record. */
HostdAgentRecord *hostd_test_agent_new(HostdTestFixture *f, const char *name, HostdTestState state);

/* Makes stopped agent @name (hostd_test_agent_new()) what an agent made of a warm pool's machine
 * is: its domain renamed @machine, its dir moved to <state dir>/pool/@machine and its name in
 * agents/ a link to it, `domain = @machine` in its record. The alias is not set (a restart's
 * reconcile sets it). Returns the machine's dir, newly allocated. */
char *hostd_test_agent_as_pool_machine(HostdTestFixture *f, const char *name, const char *machine);

/* <agents dir>/<name>/<file>, newly allocated. */
char *hostd_test_agent_file(HostdTestFixture *f, const char *name, const char *file);

/* The agent's record as on disk now (any phase). */
HostdAgentRecord *hostd_test_agent_record(HostdTestFixture *f, const char *name);

/* The domain's state as hostd names it ("running", "paused", "saved", "stopped"), or
 * "missing". */
const char *hostd_test_domain_state(HostdTestFixture *f, const char *name);

/* The file the domain's first disk names: in the persistent definition (@inactive) or the live
 * one. Newly allocated. */
char *hostd_test_domain_disk(HostdTestFixture *f, const char *name, gboolean inactive);

/* The agent's checkpoint record as on disk now. */
VmCheckpointSet *hostd_test_checkpoints(HostdTestFixture *f, const char *name);

/* The ids of the agent's checkpoints, in record order, joined with spaces ("" for none). */
char *hostd_test_checkpoint_ids(HostdTestFixture *f, const char *name);

/* Takes @n checkpoints of @name (no label, no memory), each of which must succeed. */
void hostd_test_checkpoint_n(HostdTestFixture *f, const char *name, guint n);

/* A request of @op to send hostd, its fields parsed from GVariant text (NULL: none); fails the
 * test when either does not parse or the protocol refuses them. */
VmMessage *hostd_test_request(VmOp op, const char *fields_text);

/* ---- fake images and qemu-img ---- */

/* Writes a fake image at @path standing on @backing (NULL: on nothing). */
void hostd_test_image_write(const char *path, const char *backing);

/* What the fake image at @path stands on ("" for nothing), or NULL when there is no such file.
 * Newly allocated. */
char *hostd_test_image_backing(const char *path);

/* Every qemu-img call so far, one line each (its arguments). Newly allocated. */
char *hostd_test_qemu_img_log(HostdTestFixture *f);

/* Every file qemu-img calls so far opened (or would have, as the real qemu-img does: each image
 * of a chain it reads, and each data file a header names), one line each. Newly allocated. */
char *hostd_test_qemu_img_opened(HostdTestFixture *f);

/* Makes every qemu-img call whose arguments (subcommand first: "create -q ...") contain
 * @pattern fail from now on, as an error of qemu-img; NULL: none fails. */
void hostd_test_qemu_img_fail(HostdTestFixture *f, const char *pattern);

/* Whether the egress policy agent @name's proxy applies now (the user's rules and its grants'
 * hosts) lets a connection to @host:@port through; fails the test when @name has no proxy. */
gboolean hostd_test_egress_allows(HostdContext *ctx, const char *name, const char *host,
                                  guint16 port);

/* ---- fakes for what the test driver lacks ---- */

/* Whether the guest agent answers a freeze (default: no). */
void hostd_test_fake_guest_agent(gboolean answers);

/* How many external snapshots (disk-only or memory) were taken. */
guint hostd_test_fake_snapshots(void);

/* Whether the guest's filesystems are frozen now (a freeze without its thaw). */
gboolean hostd_test_fake_frozen(void);

/* How many disk-only snapshots of a running domain were taken with its filesystems not frozen. */
guint hostd_test_fake_snapshots_unfrozen(void);

/* The block jobs run, one line each: "pull BASE" (block rebase of the running disk),
 * "commit BASE TOP" or "resize DISK BYTES" (a live resize). Newly allocated. */
char *hostd_test_fake_block_jobs(void);

/* The domain XML a saved state was last pointed at (virDomainManagedSaveDefineXML), or NULL.
 * Newly allocated. */
char *hostd_test_fake_saved_xml(void);

/* Makes domain @name's guest CPU idle (its CPU time stands still); by default a test domain
 * is busy (the test driver counts wall time as CPU time). */
void hostd_test_fake_idle_cpu(const char *name);

/* Makes virDomainGetInfo() fail for domain @name, as it does when libvirt cannot read it. */
void hostd_test_fake_cpu_unreadable(const char *name);

/* How many times the guest clock of @name was set. */
guint hostd_test_fake_clock_sets(const char *name);

/* The next @n restores of a saved state fail as a state QEMU can no longer load does. */
void hostd_test_fake_saved_restore_fails(guint n);

/* ---- what hostd logged (ctx->log) ---- */

/* The lines logged so far, joined with newlines. Newly allocated. */
char *hostd_test_log_text(void);

/* Waits up to 5 s for a line logged that contains @needle (hostd's threads log after the state
 * change a test sees); fails the running test, quoting the log, when none comes. */
void hostd_test_assert_logged(const char *needle);

/* ---- hostd's request handling ---- */

/* Starts hostd_server_serve_fd() on one end of a socketpair, in *@ret_thread, and returns the
 * other end (the client's), which gives up reading after 20 s so that a hostd that never
 * answers fails the test instead of hanging it. */
int hostd_test_serve(HostdTestFixture *f, GThread **ret_thread);

/* ---- assertions and small helpers ---- */

/* @error is @code and its message contains @needle (when not NULL). */
void hostd_test_assert_error(const GError *error, VmErrorCode code, const char *needle);

/* @v (a result of hostd, floating or NULL) sunk: owned by the caller, or NULL. */
GVariant *hostd_test_sink(GVariant *v);

/* @name's egress policy as hostd_egress_get() has it, "ALLOW|DENY", each list space-separated.
 * Newly allocated. */
char *hostd_test_egress_text(HostdTestFixture *f, const char *name);

/* The string @key of the a{sv} @dict, or NULL. Newly allocated. */
char *hostd_test_dict_string(GVariant *dict, const char *key);

/* Waits up to @timeout_ms for domain @name to reach @state; returns whether it did. */
gboolean hostd_test_wait_state(HostdTestFixture *f, const char *name, const char *state,
                               guint timeout_ms);

/* A fleet member for host @id whose etcd members listen on 127.0.0.1 at @ports (@n of them), its
 * address "ssh://root@ID.lab", its lease 2 s, its disk figures those of @dir; nothing started. */
struct _HostdCluster *hostd_test_cluster_new(const char *id, const guint *ports, guint n,
                                             const char *dir);

G_END_DECLS
