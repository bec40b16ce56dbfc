/*
 * s3 credentials: the config's keys, else the environment, else the shared
 * credentials file (AWS's order, without instance metadata), and the
 * check --dry-run and the start make that a server started now finds them.
 */
#include "common/log.h"
#include "common/util.h"
#include "kvtier/error.h"
#include "l2/adapters.h"
#include "l2/s3/s3_int.h"
#include "l2/s3/s3_nixl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Can a server started now sign requests? explicit_keys: the config has
 * them; else the environment or the credentials file must (as at open).
 * 0, or KVT_E_CONFIG with the message open would give. */
static int creds_check(bool explicit_keys, char *err, size_t errcap)
{
    if (explicit_keys)
        return 0;
    struct kvt_s3_opts o;
    memset(&o, 0, sizeof(o));
    struct s3_creds cr;
    int rc = kvt_s3_load_creds(&o, &cr, err, errcap);
    explicit_bzero(&cr, sizeof(cr));
    return rc;
}

/* "key = value" lines of [profile] in an AWS credentials file. */
static bool creds_from_file(struct s3_creds *cr)
{
    char path[600];
    const char *f = getenv("AWS_SHARED_CREDENTIALS_FILE"), *home = getenv("HOME");
    const char *prof = getenv("AWS_PROFILE");
    if (!prof || !*prof)
        prof = "default";
    if (f && *f)
        snprintf(path, sizeof(path), "%s", f);
    else if (home && *home)
        snprintf(path, sizeof(path), "%s/.aws/credentials", home);
    else
        return false;
    FILE *fp = fopen(path, "re");
    if (!fp)
        return false;
    char line[2600];
    bool in = false;
    struct s3_creds c = {0};
    while (fgets(line, sizeof(line), fp)) {
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        char *e = s + strlen(s);
        while (e > s && isspace((unsigned char)e[-1]))
            *--e = 0;
        if (*s == '[') {
            char *z = strchr(s, ']');
            if (z)
                *z = 0;
            char *name = s + 1;
            while (isspace((unsigned char)*name))
                name++;
            in = strcmp(name, prof) == 0;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || !eq || *s == '#' || *s == ';')
            continue;
        char *k = s, *v = eq + 1;
        *eq = 0;
        for (char *z = eq; z > k && isspace((unsigned char)z[-1]);)
            *--z = 0;
        while (isspace((unsigned char)*v))
            v++;
        if (strcmp(k, "aws_access_key_id") == 0)
            snprintf(c.key_id, sizeof(c.key_id), "%s", v);
        else if (strcmp(k, "aws_secret_access_key") == 0)
            snprintf(c.secret, sizeof(c.secret), "%s", v);
        else if (strcmp(k, "aws_session_token") == 0)
            snprintf(c.token, sizeof(c.token), "%s", v);
    }
    fclose(fp);
    if (!c.key_id[0] || !c.secret[0]) {
        explicit_bzero(&c, sizeof(c));
        return false;
    }
    snprintf(c.source, sizeof(c.source), "file %s [%s]", path, prof);
    *cr = c;
    explicit_bzero(&c, sizeof(c));
    return true;
}

/* Credentials: the config's keys, else AWS_ACCESS_KEY_ID /
 * AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), else the shared credentials
 * file. No instance-metadata lookup: give keys explicitly on EC2. */
int kvt_s3_load_creds(const struct kvt_s3_opts *o, struct s3_creds *c, char *err, size_t cap)
{
    memset(c, 0, sizeof(*c));
    if (o->key_id) {
        snprintf(c->key_id, sizeof(c->key_id), "%s", o->key_id);
        snprintf(c->secret, sizeof(c->secret), "%s", o->secret);
        snprintf(c->token, sizeof(c->token), "%s", o->token ? o->token : "");
        snprintf(c->source, sizeof(c->source), "config");
        return 0;
    }
    const char *k = getenv("AWS_ACCESS_KEY_ID"), *s = getenv("AWS_SECRET_ACCESS_KEY");
    if (k && *k && s && *s) {
        const char *t = getenv("AWS_SESSION_TOKEN");
        snprintf(c->key_id, sizeof(c->key_id), "%s", k);
        snprintf(c->secret, sizeof(c->secret), "%s", s);
        snprintf(c->token, sizeof(c->token), "%s", t ? t : "");
        snprintf(c->source, sizeof(c->source), "environment");
        return 0;
    }
    if (creds_from_file(c))
        return 0;
    snprintf(err, cap,
             "no AWS credentials: set \"aws_access_key_id\" and \"aws_secret_access_key\", or "
             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials "
             "(AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE)");
    return KVT_E_CONFIG;
}

/* --dry-run and the start's config check: the credentials. */
int kvt_s3_check(const struct kvt_l2_spec *spec, const void *opts, const char **field, char *msg,
                 size_t cap)
{
    (void)spec;
    return kvt_s3_nixl_obj_check(opts, field, msg, cap);
}

int kvt_s3_nixl_obj_check(const void *opts, const char **field, char *msg, size_t cap)
{
    const struct kvt_s3_opts *o = opts;
    (void)field; /* a message about no one key */
    if (o->azure)
        return kvt_s3_azure_creds_check(o->az_key || o->az_sas, msg, cap);
    return creds_check(o->key_id != NULL, msg, cap);
}
