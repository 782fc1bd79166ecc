/* Real etcd members (Debian's etcd-server) on loopback for the fleet's tests: started with
 * elections in a fraction of a second, killed by their own process handles (and with the test
 * process if it dies), a client of a few of them, a wait for an answer, an empty keyspace. Every
 * helper fails the running test (cmocka's fail_msg) instead of returning an error. */
#pragma once

#include <gio/gio.h>

#include "vm-etcd.h"

G_BEGIN_DECLS

#define VM_TEST_ETCD_BIN "/usr/bin/etcd"

/* One member: its name, data dir, 127.0.0.1 ports and process (NULL when not running). */
typedef struct {
    char *name;
    char *data_dir;
    guint client_port;
    guint peer_port;
    GSubprocess *process;
} VmTestEtcdMember;

/* Whether an etcd is installed: the tests skip without one. */
gboolean vm_test_etcd_installed(void);

/* "http://127.0.0.1:@port", newly allocated. */
char *vm_test_etcd_url(guint port);

/* Fills @m for a member @name with its data in @dir/@name; nothing is started. */
void vm_test_etcd_member_init(VmTestEtcdMember *m, const char *dir, const char *name,
                              guint client_port, guint peer_port);

/* Starts @m as a member of @cluster ("m0=http://127.0.0.1:P,..."; NULL: @m alone). Returns
 * at once: vm_test_etcd_wait_ready() waits for the answer. */
void vm_test_etcd_member_start(VmTestEtcdMember *m, const char *cluster);

/* Kills @m's process (by its own handle, never by name) and waits for it; none: no-op. */
void vm_test_etcd_member_kill(VmTestEtcdMember *m);

/* Kills @m and frees what it holds (not @m itself). */
void vm_test_etcd_member_clear(VmTestEtcdMember *m);

/* A client of the members at @ports (@n of them, tried in turn), calls bounded to 1 s. */
VmEtcd *vm_test_etcd_client(const guint *ports, guint n);

/* Waits up to 20 s until @etcd answers a linearizable read. */
void vm_test_etcd_wait_ready(VmEtcd *etcd);

/* Deletes every key: each test starts from an empty keyspace. */
void vm_test_etcd_wipe(VmEtcd *etcd);

/* One member for a whole test file, started by its group's setup in a temporary dir of its own
 * (@prefix-XXXXXX) on @client_port and @peer_port, and answering. */
typedef struct {
    char *dir;
    VmTestEtcdMember member;
} VmTestEtcdSuite;

/* The suite's member, or NULL where no etcd is installed (its tests then skip). */
VmTestEtcdSuite *vm_test_etcd_suite_new(const char *prefix, guint client_port, guint peer_port);
/* Kills the member and removes its dir. NULL is fine. */
void vm_test_etcd_suite_free(VmTestEtcdSuite *suite);
/* A test's setup: skip() where @suite is NULL (no etcd), else an empty keyspace. Returns 0. */
int vm_test_etcd_suite_test_setup(VmTestEtcdSuite *suite);
/* A client of the suite's member. */
VmEtcd *vm_test_etcd_suite_client(const VmTestEtcdSuite *suite);
/* Writes agent @name's fleet record as host @host would hold it, with @epoch. */
void vm_test_etcd_agent_put(VmEtcd *etcd, const char *name, const char *host, guint64 epoch);
/* "HOST/EPOCH" of agent @name's fleet record ("none" without one), newly allocated. */
char *vm_test_etcd_agent_owner(VmEtcd *etcd, const char *name);

G_END_DECLS
