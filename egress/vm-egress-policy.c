/* Egress policy: rule parsing, normalisation and the two decisions (host, then address). */
#include "vm-egress-policy.h"
#include "vm-error.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <string.h>

#define NAME_MAX_LEN  253
#define LABEL_MAX_LEN 63

typedef enum {
    RULE_NAME,   /* exact name */
    RULE_SUFFIX, /* "*.suffix": name holds ".suffix" */
    RULE_CIDR,
    RULE_ANY,
} RuleKind;

typedef struct {
    RuleKind kind;
    char *text; /* normalised form, as persisted */
    char *name;
    VmEgressAddress net;
    guint prefix;
    guint16 port; /* 0: none given (allow: 80 and 443; deny: every port) */
} Rule;

struct _VmEgressPolicy {
    gint ref;
    GArray *allow; /* of Rule */
    GArray *deny;
};

const char *
vm_egress_verdict_name(VmEgressVerdict verdict)
{
    switch (verdict) {
    case VM_EGRESS_ALLOW:
        return "allowed";
    case VM_EGRESS_DENY_NO_RULE:
        return "no-rule";
    case VM_EGRESS_DENY_RULE:
        return "deny-rule";
    case VM_EGRESS_DENY_ADDRESS:
        return "address";
    case VM_EGRESS_DENY_BAD_HOST:
        return "bad-host";
    default:
        return "unknown";
    }
}

/* ---------------------------------------------------------------------------------------------
 * Addresses */

static const guint8 mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

static void
address_set_v4(VmEgressAddress *address, const guint8 *four)
{
    memset(address, 0, sizeof(*address));
    address->family = AF_INET;
    memcpy(address->bytes, four, 4);
}

static void
address_set_v6(VmEgressAddress *address, const guint8 *sixteen)
{
    if (memcmp(sixteen, mapped_prefix, sizeof(mapped_prefix)) == 0) {
        address_set_v4(address, sixteen + 12);
        return;
    }
    memset(address, 0, sizeof(*address));
    address->family = AF_INET6;
    memcpy(address->bytes, sixteen, 16);
}

gboolean
vm_egress_address_parse(const char *text, VmEgressAddress *ret_address, GError **error)
{
    struct in_addr v4;
    struct in6_addr v6;

    g_return_val_if_fail(text != NULL, FALSE);

    /* glibc's inet_pton() takes exactly four decimal parts without leading zeros; inet_aton()
     * would take the octal, hex and short forms, which is what must not get through. */
    if (inet_pton(AF_INET, text, &v4) == 1) {
        address_set_v4(ret_address, (const guint8 *)&v4);
        return TRUE;
    }
    if (inet_pton(AF_INET6, text, &v6) == 1) {
        address_set_v6(ret_address, v6.s6_addr);
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is not an IP address", text);
}

gboolean
vm_egress_address_from_sockaddr(const struct sockaddr *sa, VmEgressAddress *ret_address)
{
    if (sa == NULL)
        return FALSE;
    if (sa->sa_family == AF_INET) {
        address_set_v4(ret_address, (const guint8 *)&((const struct sockaddr_in *)sa)->sin_addr);
        return TRUE;
    }
    if (sa->sa_family == AF_INET6) {
        address_set_v6(ret_address, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr);
        return TRUE;
    }
    return FALSE;
}

char *
vm_egress_address_to_string(const VmEgressAddress *address)
{
    char buf[INET6_ADDRSTRLEN];

    if (inet_ntop(address->family, address->bytes, buf, sizeof(buf)) == NULL)
        return g_strdup("?");
    return g_strdup(buf);
}

static gboolean
address_in(const VmEgressAddress *address, const VmEgressAddress *net, guint prefix)
{
    guint whole = prefix / 8, rest = prefix % 8;

    if (address->family != net->family)
        return FALSE;
    if (memcmp(address->bytes, net->bytes, whole) != 0)
        return FALSE;
    if (rest == 0)
        return TRUE;
    return ((address->bytes[whole] ^ net->bytes[whole]) & (0xff << (8 - rest))) == 0;
}

/* The IPv4 address an IPv6 address carries in a form that routes to it (NAT64 well-known prefix,
 * 6to4); FALSE when it carries none. */
static gboolean
address_embedded_v4(const VmEgressAddress *address, VmEgressAddress *ret_v4)
{
    static const guint8 nat64[12] = {0x00, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};

    if (address->family != AF_INET6)
        return FALSE;
    if (memcmp(address->bytes, nat64, sizeof(nat64)) == 0) {
        address_set_v4(ret_v4, address->bytes + 12);
        return TRUE;
    }
    if (address->bytes[0] == 0x20 && address->bytes[1] == 0x02) {
        address_set_v4(ret_v4, address->bytes + 2);
        return TRUE;
    }
    return FALSE;
}

typedef struct {
    const char *net;
    guint prefix;
} SpecialRange;

static const SpecialRange special_ranges[] = {
    {"0.0.0.0", 8},      /* "this network", unspecified */
    {"10.0.0.0", 8},     /* private */
    {"100.64.0.0", 10},  /* CGNAT */
    {"127.0.0.0", 8},    /* loopback */
    {"169.254.0.0", 16}, /* link-local */
    {"172.16.0.0", 12},  /* private */
    {"192.0.0.0", 24},   /* IETF protocol assignments */
    {"192.168.0.0", 16}, /* private */
    {"198.18.0.0", 15},  /* benchmarking */
    {"224.0.0.0", 4},    /* multicast */
    {"240.0.0.0", 4},    /* reserved, broadcast */
    {"::", 96},          /* unspecified, loopback, IPv4-compatible */
    {"64:ff9b:1::", 48}, /* local-use NAT64 */
    {"100::", 64},       /* discard */
    {"2001::", 32},      /* Teredo: carries an obfuscated IPv4 address */
    {"fc00::", 7},       /* unique local */
    {"fe80::", 10},      /* link-local */
    {"fec0::", 10},      /* site-local (deprecated) */
    {"ff00::", 8},       /* multicast */
};

gboolean
vm_egress_address_is_public(const VmEgressAddress *address)
{
    VmEgressAddress embedded;

    for (gsize i = 0; i < G_N_ELEMENTS(special_ranges); i++) {
        VmEgressAddress net;

        if (!vm_egress_address_parse(special_ranges[i].net, &net, NULL))
            g_assert_not_reached();
        if (address_in(address, &net, special_ranges[i].prefix))
            return FALSE;
    }
    if (address_embedded_v4(address, &embedded))
        return vm_egress_address_is_public(&embedded);
    return TRUE;
}

GArray *
vm_egress_local_addresses(GError **error)
{
    g_autoptr(GArray) out = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
    struct ifaddrs *list = NULL;

    if (getifaddrs(&list) < 0)
        return vm_throw_errno(error, errno, "cannot list the host's addresses"), NULL;
    for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next) {
        VmEgressAddress address;

        if (vm_egress_address_from_sockaddr(it->ifa_addr, &address))
            g_array_append_val(out, address);
    }
    freeifaddrs(list);
    return g_steal_pointer(&out);
}

/* ---------------------------------------------------------------------------------------------
 * Names */

static gboolean
label_is_number(const char *label, gsize len)
{
    gsize i = 0;

    /* Every form inet_aton() reads as a number: decimal, octal (leading 0), hex (0x). */
    if (len >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X')) {
        for (i = 2; i < len; i++)
            if (!g_ascii_isxdigit(label[i]))
                return FALSE;
        return TRUE;
    }
    for (i = 0; i < len; i++)
        if (!g_ascii_isdigit(label[i]))
            return FALSE;
    return len > 0;
}

/* Checks a lower-cased name without trailing dot; the error says why, callers say what. */
static gboolean
name_check(const char *name, GError **error)
{
    gsize len = strlen(name);
    const char *label = name;

    if (len == 0 || len > NAME_MAX_LEN)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "empty or longer than %d", NAME_MAX_LEN);
    for (;;) {
        const char *dot = strchr(label, '.');
        gsize n = dot != NULL ? (gsize)(dot - label) : strlen(label);

        if (n == 0 || n > LABEL_MAX_LEN)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "labels must be 1-%d characters",
                            LABEL_MAX_LEN);
        if (label[0] == '-' || label[n - 1] == '-')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "a label starts or ends with '-'");
        for (gsize i = 0; i < n; i++)
            if (!g_ascii_isalnum(label[i]) && label[i] != '-')
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "only letters, digits, '-' and '.' are allowed");
        if (dot == NULL) {
            if (label_is_number(label, n))
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "numeric IP spellings other than a dotted quad "
                                "are refused");
            return TRUE;
        }
        label = dot + 1;
    }
}

char *
vm_egress_host_normalise(const char *host, GError **error)
{
    g_autofree char *name = NULL;
    VmEgressAddress address;
    gsize len;

    g_return_val_if_fail(host != NULL, NULL);

    for (const char *p = host; *p != '\0'; p++)
        if ((guchar)*p >= 0x80 || (guchar)*p <= 0x20)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "host '%s': only ASCII without spaces (use punycode)", host),
                   NULL;
    if (vm_egress_address_parse(host, &address, NULL))
        return vm_egress_address_to_string(&address);
    if (strchr(host, ':') != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "host '%s' is not a valid address", host),
               NULL;
    name = g_ascii_strdown(host, -1);
    len = strlen(name);
    if (len > 1 && name[len - 1] == '.')
        name[len - 1] = '\0';
    if (!name_check(name, error)) {
        g_prefix_error(error, "host '%s': ", host);
        return NULL;
    }
    return g_steal_pointer(&name);
}

/* ---------------------------------------------------------------------------------------------
 * Rules */

static void
rule_clear(gpointer data)
{
    Rule *rule = data;

    g_free(rule->text);
    g_free(rule->name);
}

static gboolean
rule_parse_cidr(const char *text, const char *target, Rule *rule, GError **error)
{
    g_autofree char *addr_text = g_strdup(target);
    char *slash = strchr(addr_text, '/');
    guint64 prefix;
    guint max;
    g_autofree char *canonical = NULL;
    VmEgressAddress check;

    if (slash != NULL)
        *slash = '\0';
    if (!vm_egress_address_parse(addr_text, &rule->net, NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': bad address", text);
    if (rule->net.family == AF_INET6 && strchr(addr_text, '.') != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress rule '%s': write IPv4 networks in IPv4 form", text);
    max = rule->net.family == AF_INET ? 32 : 128;
    if (slash == NULL) {
        prefix = max;
    } else {
        const char *digits = slash + 1;

        if (*digits == '\0' || strlen(digits) > 3 || (digits[0] == '0' && digits[1] != '\0'))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': bad prefix", text);
        for (const char *p = digits; *p != '\0'; p++)
            if (!g_ascii_isdigit(*p))
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': bad prefix",
                                text);
        prefix = g_ascii_strtoull(digits, NULL, 10);
        if (prefix > max)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "egress rule '%s': prefix longer than %u", text, max);
    }
    /* Host bits set usually mean a typo in the prefix length; refuse rather than guess. */
    check = rule->net;
    for (guint bit = (guint)prefix; bit < max; bit++)
        check.bytes[bit / 8] &= ~(0x80 >> (bit % 8));
    if (memcmp(check.bytes, rule->net.bytes, sizeof(check.bytes)) != 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress rule '%s': address has bits set beyond the prefix", text);
    rule->kind = RULE_CIDR;
    rule->prefix = (guint)prefix;
    canonical = vm_egress_address_to_string(&rule->net);
    rule->text = g_strdup_printf("%s/%u", canonical, rule->prefix);
    return TRUE;
}

static gboolean
rule_parse_port(const char *digits, guint16 *ret_port)
{
    guint64 port;

    if (*digits == '\0' || strlen(digits) > 5 || digits[0] == '0')
        return FALSE;
    for (const char *p = digits; *p != '\0'; p++)
        if (!g_ascii_isdigit(*p))
            return FALSE;
    port = g_ascii_strtoull(digits, NULL, 10);
    if (port > 65535)
        return FALSE;
    *ret_port = (guint16)port;
    return TRUE;
}

/* Splits "target[:port]" in place: a port follows the last ':' of a name or IPv4 target, or the
 * ']' of a bracketed IPv6 one ("[2001:db8::]/32:443"); an unbracketed IPv6 target (more than
 * one ':') has no port. *@ret_port is 0 when none was given. */
static gboolean
rule_split_port(char *lower, const char *text, char **ret_target, guint16 *ret_port, GError **error)
{
    char *colon;

    *ret_port = 0;
    *ret_target = lower;
    if (lower[0] == '[') {
        char *end = strchr(lower, ']');

        if (end == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': missing ']'",
                            text);
        colon = strrchr(end, ':');
        /* brackets are only there to set a port apart */
        if (colon == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "egress rule '%s': brackets only with a port ('[2001:db8::]/32:443')",
                            text);
        *colon = '\0';
        if (!rule_parse_port(colon + 1, ret_port))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "egress rule '%s': bad port (1-65535)", text);
        /* "[addr]/prefix" becomes "addr/prefix" */
        memmove(end, end + 1, strlen(end + 1) + 1);
        *ret_target = lower + 1;
        if (strchr(*ret_target, ':') == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "egress rule '%s': brackets only around an IPv6 address", text);
        return TRUE;
    }
    colon = strchr(lower, ':');
    if (colon == NULL || strchr(colon + 1, ':') != NULL)
        return TRUE;
    *colon = '\0';
    if (!rule_parse_port(colon + 1, ret_port))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': bad port (1-65535)",
                        text);
    return TRUE;
}

/* The persisted form of @rule: its target's normalised text with the port, if any. */
static void
rule_set_text(Rule *rule, const char *target)
{
    if (rule->port == 0)
        rule->text = g_strdup(target);
    else if (rule->kind == RULE_CIDR && rule->net.family == AF_INET6)
        rule->text = g_strdup_printf("[%.*s]%s:%u", (int)strcspn(target, "/"), target,
                                     target + strcspn(target, "/"), rule->port);
    else
        rule->text = g_strdup_printf("%s:%u", target, rule->port);
}

static gboolean rule_parse_target(const char *text, char *lower, Rule *rule, GError **error);

static gboolean
rule_parse(const char *text, Rule *rule, GError **error)
{
    g_autofree char *lower = NULL;
    char *target = NULL;
    guint16 port = 0;
    g_autofree char *target_text = NULL;

    memset(rule, 0, sizeof(*rule));
    for (const char *p = text; *p != '\0'; p++)
        if ((guchar)*p >= 0x80 || (guchar)*p <= 0x20)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "egress rule '%s': only ASCII without spaces (use punycode)", text);
    if (*text == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '': empty");
    lower = g_ascii_strdown(text, -1);
    if (!rule_split_port(lower, text, &target, &port, error))
        return FALSE;
    if (*target == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress rule '%s': no host", text);
    if (!rule_parse_target(text, target, rule, error))
        return FALSE;
    if (port != 0 && (rule->kind == RULE_ANY || strcmp(target, "none") == 0))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress rule '%s': 'any' and 'none' take no port", text);
    rule->port = port;
    target_text = g_steal_pointer(&rule->text);
    rule_set_text(rule, target_text);
    return TRUE;
}

/* Parses the target of a rule (lower case, port already split off) into @rule, with
 * rule->text its normalised form. */
static gboolean
rule_parse_target(const char *text, char *lower, Rule *rule, GError **error)
{
    gsize len;

    if (strcmp(lower, "any") == 0) {
        rule->kind = RULE_ANY;
        rule->text = g_strdup("any");
        return TRUE;
    }
    if (strchr(lower, '/') != NULL || strchr(lower, ':') != NULL ||
        vm_egress_address_parse(lower, &rule->net, NULL))
        return rule_parse_cidr(text, lower, rule, error);

    len = strlen(lower);
    if (len > 1 && lower[len - 1] == '.')
        lower[len - 1] = '\0';
    if (g_str_has_prefix(lower, "*.")) {
        if (!name_check(lower + 2, error)) {
            g_prefix_error(error, "egress rule '%s': ", text);
            return FALSE;
        }
        rule->kind = RULE_SUFFIX;
        rule->name = g_strdup(lower + 1);
        rule->text = g_strdup(lower);
        return TRUE;
    }
    if (strchr(lower, '*') != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress rule '%s': '*' only as a whole first label ('*.example.com')",
                        text);
    if (!name_check(lower, error)) {
        g_prefix_error(error, "egress rule '%s': ", text);
        return FALSE;
    }
    rule->kind = RULE_NAME;
    rule->name = g_strdup(lower);
    rule->text = g_strdup(lower);
    return TRUE;
}

static GArray *
rules_new(void)
{
    GArray *rules = g_array_new(FALSE, TRUE, sizeof(Rule));

    g_array_set_clear_func(rules, rule_clear);
    return rules;
}

static GArray *
rules_parse(const char *const *texts, GError **error)
{
    g_autoptr(GArray) rules = rules_new();
    gsize n = texts != NULL ? g_strv_length((char **)texts) : 0;

    for (gsize i = 0; i < n; i++) {
        Rule rule;
        gboolean duplicate = FALSE;

        if (g_ascii_strcasecmp(texts[i], "none") == 0 || g_ascii_strcasecmp(texts[i], "any") == 0) {
            if (n != 1)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "egress rule '%s' must stand alone in its list", texts[i]),
                       NULL;
            if (g_ascii_strcasecmp(texts[i], "none") == 0)
                break;
        }
        if (!rule_parse(texts[i], &rule, error))
            return rule_clear(&rule), NULL;
        for (guint j = 0; j < rules->len && !duplicate; j++)
            duplicate = strcmp(g_array_index(rules, Rule, j).text, rule.text) == 0;
        if (duplicate)
            rule_clear(&rule);
        else
            g_array_append_val(rules, rule);
    }
    return g_steal_pointer(&rules);
}

/* ---------------------------------------------------------------------------------------------
 * Policies */

VmEgressPolicy *
vm_egress_policy_new(const char *const *allow, const char *const *deny, GError **error)
{
    g_autoptr(GArray) allow_rules = rules_parse(allow, error);
    g_autoptr(GArray) deny_rules = NULL;
    VmEgressPolicy *policy;

    if (allow_rules == NULL)
        return NULL;
    deny_rules = rules_parse(deny, error);
    if (deny_rules == NULL)
        return NULL;
    policy = g_new0(VmEgressPolicy, 1);
    policy->ref = 1;
    policy->allow = g_steal_pointer(&allow_rules);
    policy->deny = g_steal_pointer(&deny_rules);
    return policy;
}

VmEgressPolicy *
vm_egress_policy_new_none(void)
{
    return vm_egress_policy_new(NULL, NULL, NULL);
}

VmEgressPolicy *
vm_egress_policy_ref(VmEgressPolicy *policy)
{
    g_return_val_if_fail(policy != NULL, NULL);
    g_atomic_int_inc(&policy->ref);
    return policy;
}

void
vm_egress_policy_unref(VmEgressPolicy *policy)
{
    if (policy == NULL || !g_atomic_int_dec_and_test(&policy->ref))
        return;
    g_array_unref(policy->allow);
    g_array_unref(policy->deny);
    g_free(policy);
}

static char **
rules_dup(GArray *rules, const char *empty)
{
    GPtrArray *out = g_ptr_array_new();

    for (guint i = 0; i < rules->len; i++)
        g_ptr_array_add(out, g_strdup(g_array_index(rules, Rule, i).text));
    if (rules->len == 0 && empty != NULL)
        g_ptr_array_add(out, g_strdup(empty));
    g_ptr_array_add(out, NULL);
    return (char **)g_ptr_array_free(out, FALSE);
}

char **
vm_egress_policy_dup_allow(const VmEgressPolicy *policy)
{
    return rules_dup(policy->allow, "none");
}

char **
vm_egress_policy_dup_deny(const VmEgressPolicy *policy)
{
    return rules_dup(policy->deny, NULL);
}

static gboolean
rules_equal(GArray *a, GArray *b)
{
    if (a->len != b->len)
        return FALSE;
    for (guint i = 0; i < a->len; i++)
        if (strcmp(g_array_index(a, Rule, i).text, g_array_index(b, Rule, i).text) != 0)
            return FALSE;
    return TRUE;
}

gboolean
vm_egress_policy_equal(const VmEgressPolicy *a, const VmEgressPolicy *b)
{
    return rules_equal(a->allow, b->allow) && rules_equal(a->deny, b->deny);
}

void
vm_egress_policy_to_keyfile(const VmEgressPolicy *policy, GKeyFile *keyfile, const char *group)
{
    g_auto(GStrv) allow = vm_egress_policy_dup_allow(policy);
    g_auto(GStrv) deny = vm_egress_policy_dup_deny(policy);

    g_key_file_set_string_list(keyfile, group, "allow", (const char *const *)allow,
                               g_strv_length(allow));
    g_key_file_set_string_list(keyfile, group, "deny", (const char *const *)deny,
                               g_strv_length(deny));
}

VmEgressPolicy *
vm_egress_policy_new_from_keyfile(GKeyFile *keyfile, const char *group, GError **error)
{
    g_auto(GStrv) allow = g_key_file_get_string_list(keyfile, group, "allow", NULL, NULL);
    g_auto(GStrv) deny = g_key_file_get_string_list(keyfile, group, "deny", NULL, NULL);

    return vm_egress_policy_new((const char *const *)allow, (const char *const *)deny, error);
}

/* ---------------------------------------------------------------------------------------------
 * Decisions */

/* Whether @rule covers @port: its own port, or without one 80 and 443 for an allow rule and
 * every port for a deny rule (a deny rule without a port shuts the host as a whole). */
static gboolean
rule_port_matches(const Rule *rule, guint16 port, gboolean deny)
{
    if (rule->port != 0)
        return rule->port == port;
    return deny || port == 80 || port == 443;
}

static gboolean
rules_match_name(GArray *rules, const char *name, guint16 port, gboolean deny)
{
    gsize len = strlen(name);

    for (guint i = 0; i < rules->len; i++) {
        const Rule *rule = &g_array_index(rules, Rule, i);
        gsize suffix_len;

        if (!rule_port_matches(rule, port, deny))
            continue;
        switch (rule->kind) {
        case RULE_ANY:
            return TRUE;
        case RULE_NAME:
            if (strcmp(rule->name, name) == 0)
                return TRUE;
            break;
        case RULE_SUFFIX:
            /* rule->name is ".suffix": at least one label must precede it. */
            suffix_len = strlen(rule->name);
            if (len > suffix_len && strcmp(name + len - suffix_len, rule->name) == 0)
                return TRUE;
            break;
        case RULE_CIDR:
            break;
        default:
            g_assert_not_reached();
        }
    }
    return FALSE;
}

/* Whether a CIDR rule of @rules covers @address (or the IPv4 address it embeds) at @port; "any"
 * counts only with @with_any. */
static gboolean
rules_match_address(GArray *rules, const VmEgressAddress *address, guint16 port, gboolean deny,
                    gboolean with_any)
{
    VmEgressAddress embedded;
    gboolean has_embedded = address_embedded_v4(address, &embedded);

    for (guint i = 0; i < rules->len; i++) {
        const Rule *rule = &g_array_index(rules, Rule, i);

        if (!rule_port_matches(rule, port, deny))
            continue;
        if (rule->kind == RULE_ANY && with_any)
            return TRUE;
        if (rule->kind != RULE_CIDR)
            continue;
        if (address_in(address, &rule->net, rule->prefix))
            return TRUE;
        if (has_embedded && address_in(&embedded, &rule->net, rule->prefix))
            return TRUE;
    }
    return FALSE;
}

VmEgressVerdict
vm_egress_policy_check_host(const VmEgressPolicy *policy, const char *host, guint16 port,
                            char **ret_normalised)
{
    g_autofree char *normalised = vm_egress_host_normalise(host, NULL);
    VmEgressAddress address;

    if (normalised == NULL)
        return VM_EGRESS_DENY_BAD_HOST;
    if (vm_egress_address_parse(normalised, &address, NULL)) {
        if (rules_match_address(policy->deny, &address, port, TRUE, TRUE))
            return VM_EGRESS_DENY_RULE;
        if (!rules_match_address(policy->allow, &address, port, FALSE, TRUE))
            return VM_EGRESS_DENY_NO_RULE;
    } else {
        if (rules_match_name(policy->deny, normalised, port, TRUE))
            return VM_EGRESS_DENY_RULE;
        if (!rules_match_name(policy->allow, normalised, port, FALSE))
            return VM_EGRESS_DENY_NO_RULE;
    }
    if (ret_normalised != NULL)
        *ret_normalised = g_steal_pointer(&normalised);
    return VM_EGRESS_ALLOW;
}

VmEgressVerdict
vm_egress_policy_check_name(const VmEgressPolicy *policy, const char *host, char **ret_normalised)
{
    g_autofree char *normalised = vm_egress_host_normalise(host, NULL);
    VmEgressAddress address;
    VmEgressVerdict verdict;

    if (normalised == NULL || vm_egress_address_parse(normalised, &address, NULL))
        return VM_EGRESS_DENY_BAD_HOST;
    if (vm_egress_policy_check_host(policy, normalised, 80, ret_normalised) == VM_EGRESS_ALLOW)
        return VM_EGRESS_ALLOW;
    for (guint i = 0; i < policy->allow->len; i++) {
        guint16 port = g_array_index(policy->allow, Rule, i).port;

        if (port != 0 && vm_egress_policy_check_host(policy, normalised, port, ret_normalised) ==
                             VM_EGRESS_ALLOW)
            return VM_EGRESS_ALLOW;
    }
    verdict = vm_egress_policy_check_host(policy, normalised, 443, ret_normalised);
    return verdict;
}

VmEgressVerdict
vm_egress_policy_check_address(const VmEgressPolicy *policy, const VmEgressAddress *address,
                               guint16 port, GArray *local)
{
    VmEgressAddress normal = *address;

    if (normal.family == AF_INET6)
        address_set_v6(&normal, address->bytes);
    if (rules_match_address(policy->deny, &normal, port, TRUE, TRUE))
        return VM_EGRESS_DENY_RULE;
    if (rules_match_address(policy->allow, &normal, port, FALSE, FALSE))
        return VM_EGRESS_ALLOW;
    if (!vm_egress_address_is_public(&normal))
        return VM_EGRESS_DENY_ADDRESS;
    for (guint i = 0; local != NULL && i < local->len; i++) {
        const VmEgressAddress *own = &g_array_index(local, VmEgressAddress, i);

        if (own->family == normal.family &&
            memcmp(own->bytes, normal.bytes, own->family == AF_INET ? 4 : 16) == 0)
            return VM_EGRESS_DENY_ADDRESS;
    }
    return VM_EGRESS_ALLOW;
}

VmEgressVerdict
vm_egress_policy_check_connect(const VmEgressPolicy *policy, const VmEgressAddress *address,
                               guint16 port, GArray *local)
{
    VmEgressVerdict verdict = vm_egress_policy_check_address(policy, address, port, local);

    if (verdict != VM_EGRESS_ALLOW)
        return verdict;
    for (guint i = 0; i < policy->allow->len; i++) {
        if (rule_port_matches(&g_array_index(policy->allow, Rule, i), port, FALSE))
            return VM_EGRESS_ALLOW;
    }
    return VM_EGRESS_DENY_NO_RULE;
}
