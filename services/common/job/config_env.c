/* The environment through the key table: the overrides of the keys that have one (config_apply_env),
 * parsed from text with the same types and bounds as the job file's JSON, and the settings that are no
 * key (config_env_value, config_env_bool). The only reader of PSFLEET_* variables. */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "util.h"

static int parse_bool_text(const char *s, bool *ret) {
        static const char *const yes[] = { "1", "true", "yes", "on" }, *const no[] = { "0", "false", "no", "off" };

        for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

/* The key's value from text, with the same types and bounds as the job file's JSON. */
static int parse_text(const struct ctx *x, struct job_config *c, const struct config_key *k, const char *v) {
        char range[96], q[160], why[160];

        cfg_quote_str(v, q, sizeof(q));
        switch (k->type) {
        case KT_U32:
        case KT_U64: {
                uint64_t u;

                cfg_fmt_range(k, range, sizeof(range));
                if (parse_u64(v, (uint64_t) k->imin, (uint64_t) k->imax, &u) < 0)
                        return cfg_failf(x, NULL, "%s is not an integer in %s", q, range);
                cfg_set_int(c, k, (int64_t) u);
                return 0;
        }
        case KT_DOUBLE: {
                char *end;
                double d;

                cfg_fmt_range(k, range, sizeof(range));
                errno = 0;
                d = strtod(v, &end);
                if (errno || end == v || *end || !(d >= k->dmin && d <= k->dmax) || (k->dmin_open && d == k->dmin) ||
                    (k->dmax_open && d == k->dmax))
                        return cfg_failf(x, NULL, "%s is not a number in %s", q, range);
                memcpy(cfg_field(c, k), &d, sizeof(d));
                return 0;
        }
        case KT_BOOL:
                if (parse_bool_text(v, (bool *) cfg_field(c, k)) < 0)
                        return cfg_failf(x, NULL, "%s is not 0, 1, true or false", q);
                return 0;
        case KT_STRING:
                if (k->check && k->check(v, why, sizeof(why)) < 0)
                        return cfg_failf(x, NULL, "%s %s", q, why);
                return cfg_set_string(c, k, v) < 0 ? cfg_fail_oom(x) : 0;
        case KT_ENUM: {
                int i = cfg_lookup_choice(k->choices, v);

                if (i < 0) {
                        cfg_join_choices(k->choices, range, sizeof(range));
                        return cfg_failf(x, NULL, "%s is not one of %s", q, range);
                }
                return cfg_set_enum(c, k, i);
        }
        case KT_SPECIAL:
                break;
        }
        assert(!"an override on a special key");
        return -EINVAL;
}

static bool in_section(const struct config_key *k, const char *section) {
        size_t n = section ? strlen(section) : 0;

        return !section || (strncmp(k->name, section, n) == 0 && k->name[n] == '.');
}

int config_apply_env(struct job_config *c, const char *section, char *err, size_t errlen) {
        for (size_t i = 0; i < cfg_n_keys; i++) {
                const struct config_key *k = &cfg_keys[i];
                const struct ctx x = { .origin = k->env, .err = err, .errlen = errlen };
                const char *v;
                int r;

                if (!k->env || !in_section(k, section) || !(v = getenv(k->env)) || !*v)
                        continue;
                r = parse_text(&x, c, k, v);
                if (r < 0)
                        return r;
        }
        return 0;
}

int config_section_defaults(struct job_config *c, const char *section) {
        for (size_t i = 0; i < cfg_n_keys; i++)
                if (in_section(&cfg_keys[i], section) && cfg_set_default(c, &cfg_keys[i]) < 0)
                        return -ENOMEM;
        return 0;
}

static const struct config_env_setting *env_setting(const char *name) {
        for (size_t i = 0; i < cfg_n_env_settings; i++)
                if (strcmp(cfg_env_settings[i].name, name) == 0)
                        return &cfg_env_settings[i];
        assert(!"an environment setting missing from the table (config_keys.c)");
        return NULL;
}

const char *config_env_value(const char *name) {
        env_setting(name);
        return getenv(name);
}

int config_env_bool(const char *name, bool *ret, char *err, size_t errlen) {
        const struct ctx x = { .origin = name, .err = err, .errlen = errlen };
        const char *v = config_env_value(name);
        char q[160];

        assert(env_setting(name)->type == KT_BOOL);
        *ret = false;
        if (!v || !*v)
                return 0;
        if (parse_bool_text(v, ret) < 0)
                return cfg_failf(&x, NULL, "%s is not 0, 1, true or false", cfg_quote_str(v, q, sizeof(q)));
        return 0;
}
