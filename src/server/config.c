#include "server/config_int.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"
#include "kvtier/error.h"
#include "ops/envcfg.h"
#include "ops/preflight.h"
#include "common/secret.h"
#include "l1/l1.h"

#include <arpa/inet.h>
#include <zmq.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* An adapter as the user named it: "--data-dir", "--config FILE", or
 * "--l2-adapter #i (type)"; field: the key or flag holding its path. */
static void label(const struct kvt_l2_spec *a, const char *field, char *out, size_t cap, char *fout,
                  size_t fcap)
{
    if (a->origin[0])
        snprintf(out, cap, "%s", a->origin);
    else
        snprintf(out, cap, "--l2-adapter #%d (%s)", a->index, a->type);
    if (!strcmp(a->origin, "--data-dir") || !field)
        fout[0] = 0;
    else if (!strncmp(a->origin, "--config", 8))
        snprintf(fout, fcap, "KVP_CACHE_ROOT: ");
    else
        snprintf(fout, fcap, "\"%s\": ", field);
}

/* Storage checks that need nothing opened (--dry-run runs them too): each
 * adapter's directory or device (kvt_l2_spec_check), and no two adapters
 * on one directory or device: they would split one server's objects and
 * each count only its own against the cap. Returns 0 or 2 (printed). */
static int check_storage(const struct kvt_server_cfg *c)
{
    char msg[PATH_MAX + 256], la[400], lb[400], fa[64], fb[64];
    for (int i = 0; i < c->nadapters && !c->no_storage_check; i++) {
        const char *field = NULL;
        if (kvt_l2_spec_check(&c->adapters[i], &field, msg, sizeof(msg))) {
            label(&c->adapters[i], field, la, sizeof(la), fa, sizeof(fa));
            fprintf(stderr, "kvtier server: %s: %s%s\n", la, fa, msg);
            return 2;
        }
    }
    for (int i = 0; i < c->nadapters; i++) {
        const char *fi = NULL;
        bool di = false;
        const char *pi = kvt_l2_spec_storage(&c->adapters[i], &fi, &di);
        for (int j = 0; pi && j < i; j++) {
            const char *fj = NULL;
            bool dj = false;
            const char *pj = kvt_l2_spec_storage(&c->adapters[j], &fj, &dj);
            char shown[PATH_MAX];
            if (!pj || !kvt_l2_same_storage(pi, pj, shown, sizeof(shown)))
                continue;
            label(&c->adapters[j], fj, la, sizeof(la), fa, sizeof(fa));
            label(&c->adapters[i], fi, lb, sizeof(lb), fb, sizeof(fb));
            fprintf(stderr,
                    "kvtier server: %s and %s use the same %s %s (given as \"%s\" and "
                    "\"%s\"): two adapters of one server would split its objects between "
                    "them; give each its own\n",
                    la, lb, di && dj ? "directory" : "path", shown, pj, pi);
            return 2;
        }
    }
    return 0;
}

int kvt_server_io_threads(const struct kvt_server_cfg *c)
{
    if (c->io_threads > 0)
        return c->io_threads;
    if (!c->auth_key_file[0])
        return 1;
    long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;
    return n < 1 ? 1 : n > 4 ? 4 : (int)n;
}

bool kvt_host_is_loopback(const char *host)
{
    char h[256];
    size_t l = strlen(host);
    if (l >= sizeof(h))
        return false;
    if (l >= 2 && host[0] == '[' && host[l - 1] == ']') { /* [::1] */
        memcpy(h, host + 1, l - 2);
        h[l - 2] = 0;
    } else {
        memcpy(h, host, l + 1);
    }
    if (!strcasecmp(h, "localhost"))
        return true;
    struct in_addr a4;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    return inet_pton(AF_INET6, h, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

bool kvt_endpoint_is_local(const char *ep)
{
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9))
        return true; /* file permissions / abstract socket on this host */
    if (strncmp(ep, "tcp://", 6))
        return false;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h || (size_t)(colon - h) >= 256 || memchr(h, ';', (size_t)(colon - h)))
        return false; /* "tcp://src;dst" and the like: not judged, not local */
    char host[256];
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = 0;
    return kvt_host_is_loopback(host);
}

/* Two listeners on these hosts and one port would collide: the same
 * address, a wildcard on either side, or localhost and 127.0.0.1. */
static bool hosts_collide(const char *a, const char *b)
{
    const char *any[] = {"*", "0.0.0.0", "::", "[::]", ""};
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        if (!strcmp(a, any[i]) || !strcmp(b, any[i]))
            return true;
    bool la = !strcasecmp(a, "localhost") || !strcmp(a, "127.0.0.1");
    bool lb = !strcasecmp(b, "localhost") || !strcmp(b, "127.0.0.1");
    return !strcasecmp(a, b) || (la && lb);
}

/* --http-port or --lmcache-port equal to the request port (or to each
 * other) on colliding hosts: refused here, naming the key, rather than a
 * failed bind at start-up. 0 or 2. */
static int check_ports(const struct kvt_server_cfg *c)
{
    char host[256] = "";
    int port = 0;
    const char *h = c->bind + 6, *colon = strrchr(h, ':');
    if (!strncmp(c->bind, "tcp://", 6) && colon && (size_t)(colon - h) < sizeof host) {
        memcpy(host, h, (size_t)(colon - h));
        host[colon - h] = 0;
        port = atoi(colon + 1);
    }
    bool lmc_tcp = c->lmc.port && !kvt_lmc_host_is_ipc(c->lmc.host);
    const char *key = NULL, *other = NULL;
    int p = 0;
    if (c->http_port && port && c->http_port == port && hosts_collide(c->http_host, host))
        key = "--http-port", other = "--port", p = port;
    else if (lmc_tcp && port && c->lmc.port == port && hosts_collide(c->lmc.host, host))
        key = "--lmcache-port", other = "--port", p = port;
    else if (lmc_tcp && c->http_port && c->lmc.port == c->http_port &&
             hosts_collide(c->lmc.host, c->http_host))
        key = "--lmcache-port", other = "--http-port", p = c->http_port;
    if (!key)
        return 0;
    fprintf(stderr, "kvtier server: %s: port %d is also %s's; give each listener its own port\n",
            key, p, other);
    return 2;
}

/* --l1-size-gb: one range, what L1 can address (page numbers of
 * --l1-align-bytes pages are 32 bits), and what this host can give the pool
 * (l1/hostmem.h): a mapping beyond RLIMIT_AS, or a preallocated pool beyond
 * what can be allocated now, is refused; a lazy pool beyond what the host
 * could ever back is judged a warning (shown at start, in /status and by
 * --dry-run). Runs before anything is created; with --no-storage-check the
 * range only. 0 or 2 (printed). */
static int check_l1(struct kvt_server_cfg *c)
{
    double max_gb = floor((double)kvt_l1_max_bytes(c->l1_align) / KVT_GIB * 1000) / 1000;
    if (!(c->l1_size_gb >= 0.001) || c->l1_size_gb > max_gb) {
        fprintf(stderr,
                "kvtier server: --l1-size-gb: %.15g is out of range [0.001, %.3f] (pages of "
                "--l1-align-bytes %u, counted in 32 bits)\n",
                c->l1_size_gb, max_gb, c->l1_align);
        return 2;
    }
    if (c->l1_align > c->l1_size_gb * KVT_GIB) {
        fprintf(stderr, "kvtier server: --l1-align-bytes larger than --l1-size-gb\n");
        return 2;
    }
    if (c->no_storage_check)
        return 0;
    struct kvt_hostmem h;
    kvt_hostmem_read("", &h);
    /* with the LMCache front end the pool is a named object in /dev/shm */
    kvt_l1_fit(&h, (uint64_t)(c->l1_size_gb * KVT_GIB), c->l1_lazy, c->l1_hugepages,
               c->lmc.port && c->shm, &c->l1_fit);
    c->l1_fit_checked = true;
    if (c->l1_fit.verdict == KVT_L1_FIT_REFUSE) {
        fprintf(stderr, "kvtier server: %s\n", c->l1_fit.msg);
        return 2;
    }
    return 0;
}

/* The LMCache front end with --auth-key. LMCache's client has no CURVE, so
 * it listens only on a Unix socket, where the ZAP handler admits the
 * server's uid alone (SO_PEERCRED), and its requests act as one authorized
 * client (--lmcache-client). 0 or 2. */
static int check_lmcache_auth(struct kvt_server_cfg *c)
{
    if (!kvt_lmc_host_is_ipc(c->lmc.host)) {
        fprintf(stderr,
                "kvtier server: --lmcache-host: with --auth-key the LMCache front end listens "
                "only on a Unix socket (LMCache's client has no CURVE; there only the server's "
                "uid is admitted): give --lmcache-host ipc:///PATH and --lmcache-client NAME, and "
                "in vLLM \"lmcache.mp.host\": \"ipc:///PATH\" (docs/security.md)\n");
        return 2;
    }
    if (!c->lmc.client[0]) {
        fprintf(stderr,
                "kvtier server: --lmcache-client: with --auth-key, name the authorized client "
                "(its name= label or public key in %s) whose tenants and rights the LMCache "
                "port's requests get\n",
                c->auth_clients_file);
        return 2;
    }
    uint32_t n;
    if (!kvt_auth_named(c->auth, c->lmc.client, &n)) {
        fprintf(stderr,
                "kvtier server: --lmcache-client: %s names %s in %s: give a client's name= "
                "label (unique) or public key\n",
                c->lmc.client, n ? "several clients" : "no client", c->auth_clients_file);
        return 2;
    }
    return 0;
}

/* Load the key, the clients and the token the flags name, and refuse to
 * listen beyond loopback without authentication (unless --insecure-no-auth).
 * 0 or 2 (message printed, naming the flag). */
/* A bearer token file (--http-token, --admin-token): mode 0600, one line
 * of at least 16 characters without spaces. 0, or 2 (printed). */
static int read_token(const char *flag, const char *file, char *tok, size_t cap)
{
    char err[1200];
    if (!file[0])
        return 0;
    if (kvt_secret_read(file, true, tok, cap, err, sizeof(err))) {
        fprintf(stderr, "kvtier server: --%s: %s\n", flag, err);
        return 2;
    }
    if (strlen(tok) < 16 || strpbrk(tok, " \t")) {
        kvt_secret_wipe(tok, cap);
        fprintf(stderr,
                "kvtier server: --%s: %s: the token must be at least 16 characters without "
                "spaces\n",
                flag, file);
        return 2;
    }
    return 0;
}

static int check_auth(struct kvt_server_cfg *c)
{
    char err[1200];
    if (!c->auth_key_file[0] != !c->auth_clients_file[0]) {
        fprintf(stderr,
                "kvtier server: --%s: --auth-key and --auth-clients go together (the "
                "server's key, and the keys it admits)\n",
                c->auth_key_file[0] ? "auth-clients" : "auth-key");
        return 2;
    }
    if (c->auth_key_file[0]) {
        if (!zmq_has("curve")) {
            fprintf(stderr, "kvtier server: --auth-key: this libzmq has no CURVE support\n");
            return 2;
        }
        if (kvt_secret_read(c->auth_key_file, true, c->auth_secret, sizeof(c->auth_secret), err,
                            sizeof(err))) {
            fprintf(stderr, "kvtier server: --auth-key: %s\n", err);
            return 2;
        }
        if (!kvt_z85_key_ok(c->auth_secret) || zmq_curve_public(c->auth_public, c->auth_secret)) {
            kvt_secret_wipe(c->auth_secret, sizeof(c->auth_secret));
            fprintf(stderr,
                    "kvtier server: --auth-key: %s does not hold a CURVE secret key (40 "
                    "Z85 characters, as kvtier keygen writes to NAME.key)\n",
                    c->auth_key_file);
            return 2;
        }
        if (kvt_auth_load(c->auth_clients_file, &c->auth, err, sizeof(err))) {
            fprintf(stderr, "kvtier server: --auth-clients: %s\n", err);
            return 2;
        }
        /* the same-host socket stays: a connection there is bound to a key
         * by a ticket from a hello over CURVE (local.c, docs/security.md) */
    }
    if (read_token("http-token", c->http_token_file, c->http_token, sizeof(c->http_token)) ||
        read_token("admin-token", c->admin_token_file, c->admin_token, sizeof(c->admin_token)))
        return 2;
    static const char hint[] = "give --insecure-no-auth to accept that (docs/security.md)";
    if (c->lmc.client[0] && !c->auth) {
        fprintf(stderr, "kvtier server: --lmcache-client: only with --auth-key and "
                        "--auth-clients (it names one of the authorized clients)\n");
        return 2;
    }
    /* with authentication on, the LMCache port authenticates too, whatever
     * --insecure-no-auth says */
    if (c->lmc.port && c->auth && check_lmcache_auth(c))
        return 2;
    if (c->insecure_no_auth)
        return 0;
    if (!c->auth && !kvt_endpoint_is_local(c->bind)) {
        fprintf(stderr,
                "kvtier server: --host: %s (--host, --bind or --config's KVP_SERVER_URL) "
                "is reachable beyond this host and "
                "authentication is off: give --auth-key and --auth-clients, or %s\n",
                c->bind, hint);
        return 2;
    }
    if (c->http_port && !c->http_token[0] && !kvt_host_is_loopback(c->http_host)) {
        fprintf(stderr,
                "kvtier server: --http-host: %s is beyond loopback and /status and "
                "/metrics have no token: give --http-token, or %s\n",
                c->http_host, hint);
        return 2;
    }
    if (c->lmc.port && !c->auth && !kvt_lmc_host_is_ipc(c->lmc.host) &&
        !kvt_host_is_loopback(c->lmc.host)) {
        fprintf(stderr,
                "kvtier server: --lmcache-port: the LMCache protocol front end has no "
                "authentication of its own and --lmcache-host is beyond loopback; %s\n",
                hint);
        return 2;
    }
    return 0;
}

/* --config: the operator's file becomes adapter #0 (before any
 * --l2-adapter), and its KVP_SERVER_URL the listening address. *adapter:
 * its spec (malloc'd). 0 or 2 (printed). */
static int load_config_file(struct kvt_opt_parse *p, char **adapter)
{
    struct kvt_server_cfg *c = p->c;
    struct kvt_envcfg ec;
    char cerr[1024];
    if (kvt_envcfg_load(p->config_path, &ec, cerr, sizeof(cerr))) {
        fprintf(stderr, "kvtier server: --config: %s\n", cerr);
        return 2;
    }
    if (c->no_l2) {
        kvt_envcfg_free(&ec);
        fprintf(stderr, "kvtier server: --no-l2 and --config exclude each other\n");
        return 2;
    }
    if (p->nl2 == KVT_MAX_ADAPTERS) {
        kvt_envcfg_free(&ec);
        fprintf(stderr, "kvtier server: --l2-adapter: at most %d adapters with --config\n",
                KVT_MAX_ADAPTERS - 1);
        return 2;
    }
    if (!p->bind_given && ec.url_set)
        snprintf(c->bind, sizeof(c->bind), "%s", ec.url);
    struct kvt_preflight pf;
    kvt_preflight_run(ec.root, ec.device, (uint64_t)(ec.budget_gb * KVT_GIB), &pf);
    if (pf.warning[0])
        kvt_warn("pre-flight: %s", pf.warning);
    c->config_file = kvt_envcfg_json(&ec);
    json_object_set_new(c->config_file, "preflight", kvt_preflight_json(&pf));
    *adapter = kvt_envcfg_adapter_json(&ec);
    kvt_envcfg_free(&ec);
    for (int i = p->nl2; i > 0; i--)
        p->l2_args[i] = p->l2_args[i - 1];
    p->l2_args[0] = *adapter;
    p->nl2++;
    return 0;
}

/* The LMCache front end's needs of the pool, and its default shm name.
 * 0 or 2 (printed). */
static int check_lmcache_pool(struct kvt_server_cfg *c)
{
    if (c->lmc.port && c->l1_hugepages) {
        fprintf(stderr, "kvtier server: --lmcache-port: LMCache workers open the L1 pool by its "
                        "POSIX shm name, which huge pages cannot have; drop --l1-use-hugepages\n");
        return 2;
    }
    if (c->lmc.port && !c->shm) {
        fprintf(stderr, "kvtier server: --lmcache-port: the LMCache engine-driven path needs "
                        "the shared-memory pool; drop --no-shm\n");
        return 2;
    }
    if (c->lmc.port && !c->lmc.shm_name[0])
        snprintf(c->lmc.shm_name, sizeof(c->lmc.shm_name), "lmcache_l1_pool_kvtier_%d",
                 (int)getpid());
    return 0;
}

/* No --l2-adapter: the embedded default, one fs adapter under data_dir.
 * 0 or 2 (printed). */
static int default_adapter(struct kvt_server_cfg *c)
{
    char err[1024];
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string("fs"));
    json_object_set_new(j, "base_path", json_string(c->data_dir));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    int rc = kvt_l2_spec_parse(text, 0, &c->adapters[0], err, sizeof(err));
    free(text);
    if (rc) {
        fprintf(stderr, "kvtier server: --data-dir: %s\n", err);
        return 2;
    }
    c->nadapters = 1;
    c->default_adapter = true;
    snprintf(c->adapters[0].origin, sizeof(c->adapters[0].origin), "--data-dir");
    return 0;
}

/* Each --l2-adapter (and --config's) parsed, then the limit an adapter
 * puts on --eviction-interval-ms. 0 or 2 (printed). */
static int parse_adapters(struct kvt_opt_parse *p, const char *cfg_adapter)
{
    struct kvt_server_cfg *c = p->c;
    char err[1024];
    for (int i = 0; i < p->nl2; i++) {
        if (kvt_l2_spec_parse(p->l2_args[i], i, &c->adapters[i], err, sizeof(err))) {
            bool from_cfg = cfg_adapter && i == 0;
            fprintf(stderr, "kvtier server: %s%s%s%s\n", from_cfg ? "--config " : "",
                    from_cfg ? p->config_path : "", from_cfg ? ": " : "", err);
            return 2;
        }
        if (cfg_adapter && i == 0)
            snprintf(c->adapters[0].origin, sizeof(c->adapters[0].origin), "--config %s",
                     p->config_path);
        c->nadapters = i + 1;
    }
    for (int i = 0; i < c->nadapters; i++) {
        int max = kvt_l2_spec_max_interval_ms(&c->adapters[i]);
        if (max && c->eviction_interval_ms > max) {
            char la[400], fa[64];
            label(&c->adapters[i], NULL, la, sizeof(la), fa, sizeof(fa));
            fprintf(
                stderr,
                "kvtier server: %s: \"shared_budget\" on Redis or S3 needs --eviction-interval-ms "
                "<= %d (got %d): each eviction cycle renews this server's %d ms lease in "
                "the shared record, and a longer interval lets the lease end while the "
                "server runs (the others would fold its entry)\n",
                la, max, c->eviction_interval_ms, KVT_L2_BUDGET_LEASE_MS);
            return 2;
        }
    }
    return 0;
}

/* The flags (options.c), then what involves several of them. */
static int parse(struct kvt_opt_parse *p, int argc, char **argv, char **cfg_adapter)
{
    struct kvt_server_cfg *c = p->c;
    const char *lf = getenv("KVT_LOG_FORMAT");
    if (lf && lf[0]) {
        c->log_format = kvt_log_parse_format(lf);
        if (c->log_format < 0) {
            fprintf(stderr, "kvtier server: KVT_LOG_FORMAT: expected text or json, got '%s'\n", lf);
            return 2;
        }
    }
    int rc = kvt_opt_parse_args(p, argc, argv);
    if (rc)
        return rc;
    if (c->no_storage_check && !c->dry_run) {
        fprintf(stderr, "kvtier server: --no-storage-check goes with --dry-run only (a server "
                        "checks what it opens)\n");
        return 2;
    }
    if (p->config_path && (rc = load_config_file(p, cfg_adapter)))
        return rc;
    /* the initial size is capped at the pool size (L1 does so too): show
     * what is used, not 20 GiB for a 0.25 GiB pool */
    if (c->l1_init_size_gb > c->l1_size_gb)
        c->l1_init_size_gb = c->l1_size_gb;
    if (!c->bind[0])
        snprintf(c->bind, sizeof(c->bind), "tcp://%s:%d", c->host, c->port);
    if ((rc = check_ports(c)) || (rc = check_auth(c)) || (rc = check_lmcache_pool(c)) ||
        (rc = check_l1(c)) || (rc = kvt_evpub_cfg_check(&c->events, c->insecure_no_auth)))
        return rc;
    if (c->no_l2) {
        if (p->nl2) {
            fprintf(stderr, "kvtier server: --no-l2 and --l2-adapter exclude each other\n");
            return 2;
        }
        return 0;
    }
    rc = p->nl2 == 0 ? default_adapter(c) : parse_adapters(p, *cfg_adapter);
    return rc ? rc : check_storage(c);
}

int kvt_server_cfg_parse(struct kvt_server_cfg *c, int argc, char **argv)
{
    struct kvt_opt_parse p = {.c = c};
    char *cfg_adapter = NULL;
    kvt_opt_defaults(&p);
    int rc = parse(&p, argc, argv, &cfg_adapter);
    free(cfg_adapter);
    if (rc == 2)
        kvt_server_cfg_free(c);
    return rc;
}

void kvt_server_cfg_free(struct kvt_server_cfg *c)
{
    kvt_auth_free(c->auth);
    c->auth = NULL;
    kvt_secret_wipe(c->auth_secret, sizeof(c->auth_secret));
    kvt_secret_wipe(c->http_token, sizeof(c->http_token));
    kvt_secret_wipe(c->admin_token, sizeof(c->admin_token));
    for (int i = 0; i < c->nadapters; i++)
        kvt_l2_spec_free(&c->adapters[i]);
    c->nadapters = 0;
    json_decref(c->config_file);
    c->config_file = NULL;
}

json_t *kvt_server_cfg_json(const struct kvt_server_cfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "bind", json_string(c->bind));
    json_object_set_new(o, "chunk_size", json_integer(c->chunk_size));
    json_object_set_new(o, "max_workers", json_integer(c->max_workers));
    json_object_set_new(o, "io_threads", json_integer(kvt_server_io_threads(c)));
    json_object_set_new(o, "max_object_bytes", json_integer((json_int_t)c->max_object_bytes));
    json_object_set_new(o, "shm", json_boolean(c->shm));
    json_object_set_new(o, "local_socket", json_boolean(c->local && c->shm));
    json_t *l1 = json_object();
    json_object_set_new(l1, "size_gb", json_real(c->l1_size_gb));
    json_object_set_new(l1, "init_size_gb", json_real(c->l1_init_size_gb));
    json_object_set_new(l1, "use_lazy", json_boolean(c->l1_lazy));
    json_object_set_new(l1, "use_hugepages", json_boolean(c->l1_hugepages));
    json_object_set_new(l1, "align_bytes", json_integer(c->l1_align));
    json_object_set_new(l1, "write_ttl_seconds", json_real(c->l1_write_ttl_s));
    json_object_set_new(l1, "read_ttl_seconds", json_real(c->l1_read_ttl_s));
    json_object_set_new(l1, "eviction_policy", json_string(c->eviction_policy));
    json_object_set_new(l1, "eviction_trigger_watermark", json_real(c->eviction_watermark));
    json_object_set_new(l1, "eviction_ratio", json_real(c->eviction_ratio));
    json_object_set_new(l1, "host_memory",
                        c->l1_fit_checked ? kvt_l1_fit_json(&c->l1_fit) : json_null());
    json_object_set_new(o, "l1", l1);
    json_t *l2 = json_array();
    for (int i = 0; i < c->nadapters; i++)
        json_array_append(l2, c->adapters[i].resolved);
    json_object_set_new(o, "l2_adapters", l2);
    json_object_set_new(o, "l2_store_policy",
                        json_string(c->store_policy == KVT_STORE_SKIP_L1 ? "skip_l1" : "default"));
    json_object_set_new(
        o, "l2_prefetch_policy",
        json_string(c->prefetch_policy == KVT_PREFETCH_RETAIN ? "retain" : "default"));
    json_object_set_new(o, "l2_prefetch_max_in_flight", json_integer(c->prefetch_max_in_flight));
    json_t *http = json_object();
    json_object_set_new(http, "host", json_string(c->http_host));
    json_object_set_new(http, "port", json_integer(c->http_port));
    json_object_set_new(o, "http", http);
    if (c->config_file)
        json_object_set(o, "config_file", c->config_file);
    json_t *lmc = json_object();
    json_object_set_new(lmc, "port", json_integer(c->lmc.port));
    json_object_set_new(lmc, "host", json_string(c->lmc.host));
    json_object_set_new(lmc, "client", c->lmc.client[0] ? json_string(c->lmc.client) : json_null());
    json_object_set_new(lmc, "shm_name", json_string(c->lmc.shm_name));
    json_object_set_new(o, "lmcache", lmc);
    json_object_set_new(o, "kv_events", kvt_evpub_cfg_json(&c->events));
    /* file names and the public key only: never a secret */
    json_t *au = json_object();
    json_object_set_new(au, "enabled", json_boolean(c->auth != NULL));
    json_object_set_new(au, "key_file", c->auth ? json_string(c->auth_key_file) : json_null());
    json_object_set_new(au, "public_key", c->auth ? json_string(c->auth_public) : json_null());
    json_object_set_new(au, "clients_file",
                        c->auth ? json_string(c->auth_clients_file) : json_null());
    json_object_set_new(au, "clients", json_integer(c->auth ? c->auth->n : 0));
    json_object_set_new(au, "http_token_file",
                        c->http_token[0] ? json_string(c->http_token_file) : json_null());
    json_object_set_new(au, "admin_token_file",
                        c->admin_token[0] ? json_string(c->admin_token_file) : json_null());
    json_object_set_new(au, "insecure_no_auth", json_boolean(c->insecure_no_auth));
    json_object_set_new(o, "auth", au);
    return o;
}
