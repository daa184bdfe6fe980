/* A job's checkpoints read back: one file into the variables (and tables), and the chains of
 * incremental checkpoints, restored (repairing what is broken) or read as they are; see chief_ckpt.h. */
#include "chief_ckpt.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chief_chain.h"
#include "chief_ckpt-internal.h"
#include "ckpt.h"
#include "log.h"
#include "optim.h"
#include "sparse_table.h"
#include "util.h"

/* ---- loading ---- */

/* Whether name is a tensor of one of the model's tables: "emb/<table>", "emb/<table>/ids" or
 * "emb/<table>/<slot>" of training.sparse_optimizer. */
static bool table_tensor(const struct chief_ckpt *s, const char *name) {
        if (!s->model || strncmp(name, "emb/", 4) != 0)
                return false;
        for (uint32_t e = 0; e < s->model->n_embeddings; e++) {
                const char *tn = s->model->emb[e].name, *rest = name + 4;
                size_t len = strlen(tn);
                if (strncmp(rest, tn, len) != 0)
                        continue;
                rest += len;
                if (!*rest || !strcmp(rest, "/ids") || !strcmp(rest, "/evicted"))
                        return true;
                for (unsigned sl = 0; *rest == '/' && sl < sparse_optimizer_n_slots(s->sparse_optimizer); sl++)
                        if (!strcmp(rest + 1, sparse_optimizer_slot_name(s->sparse_optimizer, sl)))
                                return true;
        }
        return false;
}

/* Checks table e's tensors in ck (ids U64 [n]; values and each slot F32 [n, dim]); with dups, that no id
 * comes twice (the ids read whole); with out, copies them there (malloc'd, the tables whole: the
 * readers' way, export and the evaluator). A restore streams the rows later (restore_table) and leaves
 * the check of the ids to the shards, which count an id stored twice (dups false): it reads nothing of
 * a table here. -EINVAL naming the tensor (another model), -EBADMSG (an id twice), -ENOMEM, or -errno. */
static int load_table(const struct chief_ckpt *s, struct ckpt *ck, uint32_t e, bool dups, struct ps_sparse_rows *out,
                      char *err, size_t errlen) {
        const struct embedding_spec *es = &s->model->emb[e];
        unsigned ns = sparse_optimizer_n_slots(s->sparse_optimizer);
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS];
        const void *data[1 + 1 + SPARSE_MAX_SLOTS];
        char name[80];
        snprintf(name, sizeof(name), "emb/%s/ids", es->name);
        if (ckpt_shape(ck, name, &dt, &nd, shape) < 0)
                return errf(err, errlen, -EINVAL, "no tensor \"%s\": the model has embedding table \"%s\"", name,
                            es->name);
        if (dt != CKPT_U64 || nd != 1)
                return errf(err, errlen, -EINVAL, "tensor \"%s\" is not U64 of one dimension", name);
        uint64_t n = shape[0];
        for (unsigned k = 1; k <= 1 + ns; k++) {
                if (k == 1)
                        snprintf(name, sizeof(name), "emb/%s", es->name);
                else
                        snprintf(name, sizeof(name), "emb/%s/%s", es->name,
                                 sparse_optimizer_slot_name(s->sparse_optimizer, k - 2));
                if (ckpt_shape(ck, name, &dt, &nd, shape) < 0)
                        return errf(err, errlen, -EINVAL, "no tensor \"%s\"%s", name,
                                    k == 1 ? "" : ": training.sparse_optimizer keeps that slot");
                if (dt != CKPT_F32 || nd != 2 || shape[0] != n || shape[1] != es->dim)
                        return errf(err, errlen, -EINVAL, "tensor \"%s\" is not F32 [%" PRIu64 ", %u] (its table's "
                                    "ids and dim)", name, n, es->dim);
        }
        /* the data whole only for a reader (out) */
        for (unsigned k = 0; out && k <= 1 + ns; k++) {
                if (k == 0)
                        snprintf(name, sizeof(name), "emb/%s/ids", es->name);
                else if (k == 1)
                        snprintf(name, sizeof(name), "emb/%s", es->name);
                else
                        snprintf(name, sizeof(name), "emb/%s/%s", es->name,
                                 sparse_optimizer_slot_name(s->sparse_optimizer, k - 2));
                int v = ckpt_view(ck, name, &dt, &nd, shape, &data[k]);
                if (v < 0)
                        return errf(err, errlen, v, "cannot read tensor \"%s\": %s", name, strerror(-v));
        }
        /* each id once: psfleet never writes one twice, so the file is corrupt (the previous checkpoint is
         * tried), and psd would refuse to import it */
        uint64_t dup, *ids = NULL;
        int r = 0;
        if (dups && !out && n) {
                snprintf(name, sizeof(name), "emb/%s/ids", es->name);
                if (!(ids = malloc(n * sizeof(*ids))))
                        r = -ENOMEM;
                else if ((r = ckpt_read_rows(ck, name, 0, n, ids)) < 0) {
                        free(ids);
                        return errf(err, errlen, r, "cannot read tensor \"%s\": %s", name, strerror(-r));
                }
        }
        if (r >= 0 && dups)
                r = u64_find_repeat(out ? data[0] : ids, n, &dup);
        free(ids);
        if (r < 0)
                return errf(err, errlen, r, "out of memory for table %s (%" PRIu64 " rows)", es->name, n);
        if (r)
                return errf(err, errlen, -EBADMSG, "tensor \"emb/%s/ids\" holds id %" PRIu64 " twice", es->name, dup);
        if (!out)
                return 0;
        *out = (struct ps_sparse_rows){.n = n, .dim = es->dim, .n_slots = ns};
        out->ids = malloc(n * sizeof(uint64_t) + 1);
        out->values = malloc(n * es->dim * sizeof(float) + 1);
        for (unsigned sl = 0; sl < ns; sl++)
                out->slots[sl] = malloc(n * es->dim * sizeof(float) + 1);
        bool ok = out->ids && out->values;
        for (unsigned sl = 0; sl < ns; sl++)
                ok = ok && out->slots[sl];
        if (!ok) {
                ps_sparse_rows_clear(out);
                return errf(err, errlen, -ENOMEM, "out of memory for table %s (%" PRIu64 " rows)", es->name, n);
        }
        memcpy(out->ids, data[0], n * sizeof(uint64_t));
        for (unsigned k = 1; k <= 1 + ns; k++)
                memcpy(k == 1 ? out->values : out->slots[k - 2], data[k], n * es->dim * sizeof(float));
        return 0;
}

/* An incremental checkpoint's "emb/<name>/evicted" of table e (U64 [m]) into out->ids, out->n. */
static int load_evicted(const struct chief_ckpt *s, const struct ckpt *ck, uint32_t e, struct ps_sparse_rows *out,
                        char *err, size_t errlen) {
        enum ckpt_dtype dt;
        unsigned nd;
        uint64_t shape[CKPT_MAX_DIMS];
        char name[80];
        snprintf(name, sizeof(name), "emb/%s/evicted", s->model->emb[e].name);
        if (ckpt_shape(ck, name, &dt, &nd, shape) < 0 || dt != CKPT_U64 || nd != 1)
                return errf(err, errlen, -EBADMSG, "an incremental checkpoint without a U64 tensor \"%s\"", name);
        if (!out)
                return 0;
        out->ids = malloc(shape[0] * sizeof(uint64_t) + 1);
        if (!out->ids)
                return errf(err, errlen, -ENOMEM, "out of memory");
        int r = ckpt_read_rows(ck, name, 0, shape[0], out->ids);
        if (r < 0)
                return errf(err, errlen, r, "cannot read tensor \"%s\": %s", name, strerror(-r));
        out->n = shape[0];
        return 0;
}

/* Reads and checks one checkpoint file against its row. With tables, each table whole goes there, and
 * with evicted (an incremental row) each table's evicted ids to evicted[e].ids. With keep (a restore),
 * the file is kept open in *keep on success for restore_table to stream its tables from. */
static int load_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *row, float *params, float *const *slots,
                       bool *slots_loaded, struct ps_sparse_rows *tables, struct ps_sparse_rows *evicted,
                       struct ckpt **keep, char *err, size_t errlen) {
        const struct job_layout *L = s->L;
        uint64_t max = (uint64_t)L->n_params * sizeof(float) * (1 + OPTIM_MAX_SLOTS) + (16u << 20);
        if (s->model && s->model->n_embeddings)
                max += 1ull << 36;   /* the tables' rows: as many as the job touched */
        struct ckpt *ck = NULL;
        struct ps_sparse_rows tmp_tables[MODEL_MAX_EMBEDDINGS] = {0};   /* the caller's only once all is read */
        struct ps_sparse_rows tmp_evicted[MODEL_MAX_EMBEDDINGS] = {0};
        char e[512], sum[32];
        /* read into a scratch block first: a file refused half-way must leave the caller's values as
         * they were (the previous checkpoint's, or the initializers') */
        float *tmp = malloc(L->n_params * (1 + L->n_slots) * sizeof(float) + sizeof(float)), *tmp_slots[OPTIM_MAX_SLOTS];
        if (!tmp)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (unsigned sl = 0; sl < L->n_slots; sl++)
                tmp_slots[sl] = tmp + (1 + sl) * L->n_params;
        int r = ckpt_read(row->path, max, &ck, e, sizeof(e));
        if (r == -ENOENT)
                r = errf(err, errlen, r, "the file is missing");
        else if (r == -EBADMSG || r == -EFBIG)
                r = errf(err, errlen, -EBADMSG, "%s", e);
        else if (r < 0)
                r = errf(err, errlen, r, "%s", e);
        if (r < 0)
                goto out;
        if (ckpt_bytes(ck) != row->bytes) {
                r = errf(err, errlen, -EBADMSG, "the file is %" PRIu64 " bytes, %" PRIu64 " were recorded", ckpt_bytes(ck),
                         row->bytes);
                goto out;
        }
        ckpt_format_checksum(ckpt_crc32c(ck), sum, sizeof(sum));
        if (strcmp(sum, row->checksum) != 0) {
                r = errf(err, errlen, -EBADMSG, "checksum %s, %s was recorded", sum, row->checksum);
                goto out;
        }
        const char *gs = ckpt_meta(ck, "global_step");
        uint64_t step;
        if (!gs || parse_u64(gs, 0, UINT64_MAX, &step) < 0 || step != row->global_step) {
                r = errf(err, errlen, -EBADMSG, "its metadata says global_step \"%s\", %" PRIu64 " was recorded",
                         gs ? gs : "(none)", row->global_step);
                goto out;
        }
        /* an incremental one must be the link its row says (files older than incremental checkpoints
         * have no "checkpoint": full) */
        const char *kind = ckpt_meta(ck, "checkpoint"), *ps = ckpt_meta(ck, "parent_step");
        bool inc = kind && strcmp(kind, "incremental") == 0;
        uint64_t parent = 0;
        if (inc != row->incremental || (inc && (!ps || parse_u64(ps, 0, UINT64_MAX, &parent) < 0 ||
                                                 parent != row->parent_step))) {
                r = errf(err, errlen, -EBADMSG, "its metadata says checkpoint \"%s\", parent_step \"%s\"; a%s checkpoint%s "
                         "was recorded", kind ? kind : "full", ps ? ps : "(none)",
                         row->incremental ? "n incremental" : " full", row->incremental ? " on another step" : "");
                goto out;
        }
        /* Every tensor must belong to the model: "<var>" or "<var>/<slot>". */
        for (size_t i = 0; i < ckpt_n_tensors(ck); i++) {
                char name[300];
                snprintf(name, sizeof(name), "%s", ckpt_tensor_name(ck, i));
                char *sl = strrchr(name, '/');
                if (job_layout_find(L, name) >= 0 || table_tensor(s, name))
                        continue;
                if (sl) {
                        *sl = 0;
                        if (job_layout_find(L, name) >= 0)
                                continue;
                }
                r = errf(err, errlen, -EINVAL, "tensor \"%s\" is not a variable of this job's model",
                         ckpt_tensor_name(ck, i));
                goto out;
        }
        for (uint32_t v = 0; v < L->n_vars; v++) {
                const struct job_var *jv = &L->vars[v];
                r = ckpt_get(ck, jv->name, jv->rows, jv->cols, tmp + jv->offset, e, sizeof(e));
                if (r < 0) {
                        r = errf(err, errlen, -EINVAL, "%s", e);
                        goto out;
                }
        }
        uint32_t n_tables = s->model ? s->model->n_embeddings : 0;
        for (uint32_t t = 0; t < n_tables; t++)
                if ((r = load_table(s, ck, t, !keep, tables ? &tmp_tables[t] : NULL, e, sizeof(e))) < 0 ||
                    (inc && (r = load_evicted(s, ck, t, tables && evicted ? &tmp_evicted[t] : NULL, e, sizeof(e))) < 0)) {
                        errf(err, errlen, r, "%s", e);
                        goto out;
                }
        const char *opt = ckpt_meta(ck, "optimizer");
        bool same = opt && strcmp(opt, optim_name(L->optimizer)) == 0, with_slots = false;
        if (same && slots && L->n_slots) {
                for (uint32_t v = 0; v < L->n_vars; v++)
                        for (unsigned sl = 0; sl < L->n_slots; sl++) {
                                const struct job_var *jv = &L->vars[v];
                                char name[300];
                                snprintf(name, sizeof(name), "%s/%s", jv->name, optim_slot_name(L->optimizer, sl));
                                r = ckpt_get(ck, name, jv->rows, jv->cols, tmp_slots[sl] + jv->offset, e, sizeof(e));
                                if (r < 0) {
                                        r = errf(err, errlen, -EINVAL, "optimizer %s: %s", opt, e);
                                        goto out;
                                }
                        }
                with_slots = true;
        } else if (!same && L->n_slots) {
                log_notice("Checkpoint \"%s\" was written with optimizer %s, the job uses %s: its variables are "
                           "restored, the optimizer's slots start afresh", row->path, opt ? opt : "(unknown)",
                           optim_name(L->optimizer));
        }
        const char *fp = ckpt_meta(ck, "fingerprint");
        char ours[24];
        snprintf(ours, sizeof(ours), "%016" PRIx64, s->fingerprint);
        if (fp && strcmp(fp, ours) != 0)
                log_info("Checkpoint \"%s\" was written by a job with fingerprint %s (this one: %s): the cluster or "
                         "training settings changed; its variables fit the model, so it is used",
                         row->path, fp, ours);
        memcpy(params, tmp, L->n_params * sizeof(float));
        for (unsigned sl = 0; with_slots && sl < L->n_slots; sl++)
                memcpy(slots[sl], tmp_slots[sl], L->n_params * sizeof(float));
        *slots_loaded = with_slots;
        for (uint32_t t = 0; tables && t < n_tables; t++) {
                tables[t] = tmp_tables[t];
                tmp_tables[t] = (struct ps_sparse_rows){0};
                if (evicted) {
                        evicted[t] = tmp_evicted[t];
                        tmp_evicted[t] = (struct ps_sparse_rows){0};
                }
        }
        r = 0;
        if (keep) {
                *keep = ck;
                ck = NULL;
        }
out:
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++) {
                ps_sparse_rows_clear(&tmp_tables[t]);
                ps_sparse_rows_clear(&tmp_evicted[t]);
        }
        free(tmp);
        ckpt_free(ck);
        return r;
}

int chief_ckpt_load(struct chief_ckpt *s, const struct chief_db_checkpoint *row, float *params, float *const *slots,
                    bool *slots_loaded, char *err, size_t errlen) {
        pthread_mutex_lock(&s->mu);
        int r = load_locked(s, row, params, slots, slots_loaded, NULL, NULL, NULL, err, errlen);
        pthread_mutex_unlock(&s->mu);
        return r;
}

/* ---- chains of incremental checkpoints (what a chain is: chief_chain.c) ---- */

/* Forgets row (its record, durably), moving its file aside to "<path>.corrupt" when aside, else
 * removing it; logs why. */
static void forget_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *row, bool aside, const char *what,
                          const char *why, const char *next) {
        char *moved = NULL;
        if (aside && (moved = strdup_printf("%s.corrupt", row->path)) && rename(row->path, moved) < 0) {
                free(moved);
                moved = NULL;
        }
        if (!aside)
                unlink(row->path);
        int d = chief_db_delete_checkpoint(s->db, row->global_step, NULL);
        log_warning("Checkpoint \"%s\" (global_step %" PRIu64 ") is %s: %s; %s%s%s; %s", row->path, row->global_step,
                    what, why, d < 0 ? "could not forget it" : "forgot it", moved ? ", moved the file aside to " : "",
                    moved ? moved : (aside ? "" : ", removed the file"), next);
        free(moved);
        if (aside)
                chief_ckpt_prune_corrupt_locked(s);
}


/* A broken link, chain[j] (j > 0), failing with l and the reason e: the chain restores to the link
 * before it. Missing or corrupt (-ENOENT, -EBADMSG), it is forgotten (a corrupt file set aside) and so
 * are the links after it, up to chain[k - 1], each marked gone[]; for another error it stays. */
static void break_chain_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, bool *gone,
                               const size_t *chain, size_t j, size_t k, int l, const char *e) {
        const struct chief_db_checkpoint *row = &rows[chain[j]];
        char next[200];
        snprintf(next, sizeof(next), "the chain restores to global_step %" PRIu64, rows[chain[j - 1]].global_step);
        bool corrupt = l == -ENOENT || l == -EBADMSG;
        if (corrupt) {
                forget_locked(s, row, l == -EBADMSG, l == -ENOENT ? "missing" : "corrupt", e, next);
                gone[chain[j]] = true;
        } else {
                log_warning("Cannot read checkpoint \"%s\" (global_step %" PRIu64 "): %s; %s", row->path,
                            row->global_step, e, next);
        }
        for (size_t q = j + 1; corrupt && q < k; q++) {
                char why[160];
                snprintf(why, sizeof(why), "it is chained to global_step %" PRIu64 ", which is lost", row->global_step);
                forget_locked(s, &rows[chain[q]], false, "unusable", why, next);
                gone[chain[q]] = true;
        }
}

/* Loads row i's chain into params, slots and tables: its full checkpoint, then each increment in order;
 * with cks (a restore; k of room), each link that loads is kept open there for restore_table instead.
 * With repair (a restore), a link missing or corrupt stops there: the values are those of the link
 * before it (*used, which is then not i), the bad link is set aside and forgotten and so are the links
 * after it. Without (a reader such as psfleet export), any bad link is the error, named in err, and
 * nothing is changed. Returns 0; or the full checkpoint's error (nothing loaded). */
static int load_chain_locked(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, bool *gone,
                             const size_t *chain, size_t k, bool repair, float *params, float *const *slots,
                             bool *slots_loaded, struct ps_sparse_rows *tables, struct ckpt **cks, size_t *used,
                             char *err, size_t errlen) {
        const struct job_layout *L = s->L;
        uint32_t n_tables = s->model ? s->model->n_embeddings : 0;
        int r = load_locked(s, &rows[chain[0]], params, slots, slots_loaded, tables, NULL, cks ? &cks[0] : NULL, err,
                            errlen);
        if (r < 0 && !repair) {
                char e[600];
                snprintf(e, sizeof(e), "%s", err);
                errf(err, errlen, r, "checkpoint \"%s\" (global_step %" PRIu64 "%s): %s", rows[chain[0]].path,
                     rows[chain[0]].global_step, k > 1 ? ", the full one under the chain" : "", e);
        }
        if (r < 0 || k == 1) {
                *used = chain[0];
                return r;
        }
        float *p2 = malloc(L->n_params * (1 + L->n_slots) * sizeof(float) + sizeof(float)), *s2[OPTIM_MAX_SLOTS];
        if (!p2)
                return errf(err, errlen, -ENOMEM, "out of memory");
        for (unsigned sl = 0; sl < L->n_slots; sl++)
                s2[sl] = p2 + (1 + sl) * L->n_params;
        size_t good = 0;
        for (size_t j = 1; j < k; j++) {
                const struct chief_db_checkpoint *row = &rows[chain[j]];
                struct ps_sparse_rows inc[MODEL_MAX_EMBEDDINGS] = {0}, ev[MODEL_MAX_EMBEDDINGS] = {0};
                bool sl2 = false;
                char e[600];
                int l = load_locked(s, row, p2, slots ? s2 : NULL, &sl2, tables ? inc : NULL, tables ? ev : NULL,
                                    cks ? &cks[j] : NULL, e, sizeof(e));
                for (uint32_t t = 0; l >= 0 && tables && t < n_tables; t++)
                        if ((l = chief_chain_apply(&tables[t], &inc[t], &ev[t])) < 0)
                                errf(e, sizeof(e), l, "applying it to table %s: %s", s->model->emb[t].name, strerror(-l));
                for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++) {
                        ps_sparse_rows_clear(&inc[t]);
                        ps_sparse_rows_clear(&ev[t]);
                }
                if (l == -EINVAL || (l < 0 && !repair)) {
                        free(p2);
                        if (l == -EINVAL)
                                return errf(err, errlen, l, "%s", e);
                        return errf(err, errlen, l, "checkpoint \"%s\" (global_step %" PRIu64 ", a link of the chain "
                                    "on global_step %" PRIu64 "): %s", row->path, row->global_step,
                                    rows[chain[0]].global_step, e);
                }
                if (l < 0) {
                        break_chain_locked(s, rows, gone, chain, j, k, l, e);
                        break;
                }
                memcpy(params, p2, L->n_params * sizeof(float));
                for (unsigned sl = 0; slots && sl < L->n_slots; sl++)
                        memcpy(slots[sl], s2[sl], L->n_params * sizeof(float));
                *slots_loaded = *slots_loaded && sl2;
                good = j;
        }
        free(p2);
        *used = chain[good];
        return 0;
}

/* Streams table e of a verified chain (cks[0..k): the full checkpoint, then each increment) to the
 * sink a page at a time, as restoring it from the tables whole would leave the shards: the full one's
 * rows (the shards' tables emptied first), then per increment the rows of its evicted ids and of its
 * own ids dropped, and its rows stored. So every row is stored anew, and a shard that finds one stored
 * already (the counts) has been given an id twice by one file: that file is corrupt. Memory: one page
 * of rows and slots, or of ids, whatever the table's size. Returns 0; -EBADMSG with *bad the link at
 * fault; -errno from reading the files or from the sink. */
#define RESTORE_PAGE_ROWS 65536u
static int restore_table(struct chief_ckpt *s, struct ckpt *const *cks, size_t k, uint32_t e,
                         const struct chief_table_sink *sink, size_t *bad, char *err, size_t errlen) {
        const struct embedding_spec *es = &s->model->emb[e];
        unsigned ns = sparse_optimizer_n_slots(s->sparse_optimizer);
        struct ps_sparse_rows page = {.dim = es->dim, .n_slots = ns}, none = {.dim = es->dim, .n_slots = ns};
        page.ids = malloc(RESTORE_PAGE_ROWS * sizeof(uint64_t));
        page.values = malloc((size_t)RESTORE_PAGE_ROWS * es->dim * sizeof(float));
        bool ok = page.ids && page.values;
        for (unsigned sl = 0; sl < ns; sl++)
                ok = ok && (page.slots[sl] = malloc((size_t)RESTORE_PAGE_ROWS * es->dim * sizeof(float)));
        int r = ok ? 0 : errf(err, errlen, -ENOMEM, "out of memory");
        /* the tensors: ids, rows, each slot, evicted */
        char name[1 + 1 + SPARSE_MAX_SLOTS + 1][80];
        unsigned n_names = 2 + ns;
        snprintf(name[0], sizeof(name[0]), "emb/%s/ids", es->name);
        snprintf(name[1], sizeof(name[1]), "emb/%s", es->name);
        for (unsigned sl = 0; sl < ns; sl++)
                snprintf(name[2 + sl], sizeof(name[2 + sl]), "emb/%s/%s", es->name,
                         sparse_optimizer_slot_name(s->sparse_optimizer, sl));
        snprintf(name[n_names], sizeof(name[n_names]), "emb/%s/evicted", es->name);
        for (size_t j = 0; j < k && r >= 0; j++) {
                enum ckpt_dtype dt;
                unsigned nd;
                uint64_t shape[CKPT_MAX_DIMS], n = 0, replaced = 0;
                /* an increment: the rows of its evicted ids go, then those of its own ids (which it stores
                 * again below): an id evicted and made again is in both, its row stays */
                for (unsigned t = 0; j && t < 2 && r >= 0; t++) {
                        const char *which = name[t ? 0 : n_names];
                        uint64_t m = ckpt_shape(cks[j], which, &dt, &nd, shape) == 0 ? shape[0] : 0;
                        for (uint64_t at = 0; at < m && r >= 0; at += RESTORE_PAGE_ROWS) {
                                size_t p = m - at < RESTORE_PAGE_ROWS ? (size_t)(m - at) : RESTORE_PAGE_ROWS;
                                struct ps_sparse_import_opts o = {.evicted = page.ids, .n_evicted = p};
                                if ((r = ckpt_read_rows(cks[j], which, at, p, page.ids)) < 0)
                                        errf(err, errlen, r, "cannot read tensor \"%s\": %s", which, strerror(-r));
                                else
                                        r = sink->part(sink->ud, e, &none, &o, err, errlen);
                        }
                }
                if (r >= 0 && ckpt_shape(cks[j], name[0], &dt, &nd, shape) == 0)
                        n = shape[0];
                bool clear = j == 0;   /* the first part of a table empties it, rows or none */
                for (uint64_t at = 0; (at < n || clear) && r >= 0; at += RESTORE_PAGE_ROWS) {
                        page.n = n - at < RESTORE_PAGE_ROWS ? (size_t)(n - at) : RESTORE_PAGE_ROWS;
                        for (unsigned t = 0; t < n_names && r >= 0; t++)
                                if ((r = ckpt_read_rows(cks[j], name[t], at, page.n,
                                                        t == 0 ? (void *)page.ids : t == 1 ? (void *)page.values
                                                                                           : (void *)page.slots[t - 2])) < 0)
                                        errf(err, errlen, r, "cannot read tensor \"%s\": %s", name[t], strerror(-r));
                        struct ps_sparse_import_opts o = {.clear = clear, .replaced = &replaced};
                        if (r >= 0)
                                r = sink->part(sink->ud, e, &page, &o, err, errlen);
                        clear = false;
                }
                if (r >= 0 && replaced) {
                        *bad = j;
                        r = errf(err, errlen, -EBADMSG, "tensor \"%s\" names %" PRIu64 " id(s) more than once (the "
                                 "shards found them stored already)", name[0], replaced);
                }
        }
        ps_sparse_rows_clear(&page);
        return r;
}

/* Streams every table of the verified chain cks[0..k) to the sink (restore_table). */
static int restore_tables(struct chief_ckpt *s, struct ckpt *const *cks, size_t k, const struct chief_table_sink *sink,
                          size_t *bad, char *err, size_t errlen) {
        uint32_t n_tables = s->model ? s->model->n_embeddings : 0;
        int r = 0;
        for (uint32_t e = 0; e < n_tables && r >= 0; e++)
                r = restore_table(s, cks, k, e, sink, bad, err, errlen);
        return r;
}

int chief_ckpt_restore_latest(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                              const struct chief_table_sink *sink, struct chief_db_checkpoint *ret, char *err,
                              size_t errlen) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0;
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        if (r < 0)
                return errf(err, errlen, r, "cannot list the checkpoints: %s", strerror(-r));
        bool *gone = calloc(n + 1, sizeof(*gone));
        size_t *chain = calloc(n + 1, sizeof(*chain));
        struct ckpt **cks = calloc(n + 1, sizeof(*cks));
        if (!gone || !chain || !cks) {
                free(rows);
                free(gone);
                free(chain);
                free(cks);
                return errf(err, errlen, -ENOMEM, "out of memory");
        }
        pthread_mutex_lock(&s->mu);
        r = 0;
        for (size_t i = 0; i < n; i++) {
                if (gone[i])
                        continue;
                const char *next = i + 1 < n ? "trying the previous one" : "no older checkpoint is left";
                size_t k = 0, broken = i, used = i;
                char e[600];
                int c = chief_chain_of(rows, n, gone, i, chain, &k, &broken);
                if (c < 0) {
                        char why[200];
                        snprintf(why, sizeof(why), c == -ENOENT ? "it is incremental on global_step %" PRIu64 ", which is "
                                 "not recorded (the chain points nowhere)" : "its chain never reaches a full checkpoint",
                                 rows[broken].parent_step);
                        forget_locked(s, &rows[i], false, "unusable", why, next);
                        gone[i] = true;
                        continue;
                }
                /* the chain verified first (every file's checksum and shapes), its files kept open; then its
                 * tables streamed from them to the shards */
                int l = load_chain_locked(s, rows, gone, chain, k, true, params, slots, slots_loaded, NULL,
                                          sink ? cks : NULL, &used, e, sizeof(e));
                size_t links = 0;
                while (links < k && chain[links] != used)
                        links++;
                size_t bad = 0;
                if (l == 0 && sink && sink->begin)
                        sink->begin(sink->ud, &rows[used]);
                if (l == 0 && sink && (l = restore_tables(s, cks, links + 1, sink, &bad, e, sizeof(e))) < 0 &&
                    l != -EBADMSG) {
                        /* not the file's fault (the shards, the disk): the caller retries */
                        r = errf(err, errlen, l == -EINVAL ? -EIO : l, "%s", e);
                        break;
                }
                for (size_t q = 0; q < k; q++)
                        cks[q] = ckpt_free(cks[q]);
                if (l == -EBADMSG && bad > 0) {
                        /* a link found corrupt while streaming: forgotten with the links after it, and the
                         * newest checkpoint left tried again (the link before it, normally), from the
                         * start: each restore empties the tables first */
                        break_chain_locked(s, rows, gone, chain, bad, links + 1, l, e);
                        continue;
                }
                if (l == 0) {
                        *ret = rows[used];
                        r = 1;
                        break;
                }
                const struct chief_db_checkpoint *row = &rows[chain[0]];
                if (l == -EINVAL) {
                        r = errf(err, errlen, l,
                                 "checkpoint \"%s\" (global_step %" PRIu64 ") holds a different model: %s; to start "
                                 "this job afresh, remove its state (chief.db and the checkpoints)",
                                 row->path, row->global_step, e);
                        break;
                }
                if (l == -ENOENT || l == -EBADMSG) {
                        /* the full checkpoint under the chain: every increment on it is lost with it */
                        forget_locked(s, row, l == -EBADMSG, l == -ENOENT ? "missing" : "corrupt", e, next);
                        gone[chain[0]] = true;
                } else {
                        /* Not the file's fault (permissions, I/O, memory): leave it recorded. */
                        log_warning("Cannot read checkpoint \"%s\" (global_step %" PRIu64 "): %s; %s", row->path,
                                    row->global_step, e, next);
                        for (size_t q = 0; q < k; q++)
                                gone[chain[q]] = true;   /* not tried again in this pass */
                }
        }
        pthread_mutex_unlock(&s->mu);
        for (size_t q = 0; q <= n; q++)
                ckpt_free(cks[q]);
        free(rows);
        free(gone);
        free(chain);
        free(cks);
        return r;
}

int chief_ckpt_load_latest(struct chief_ckpt *s, float *params, float *const *slots, bool *slots_loaded,
                           struct chief_db_checkpoint *ret, char *err, size_t errlen) {
        return chief_ckpt_restore_latest(s, params, slots, slots_loaded, NULL, ret, err, errlen);
}

/* Resolves rows[i]'s chain and reads it, repairing nothing (chief_ckpt_read_chain). */
static int read_chain(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, size_t n, size_t i,
                      float *params, struct ps_sparse_rows *tables, char *err, size_t errlen) {
        bool *gone = calloc(n + 1, sizeof(*gone));
        size_t *chain = calloc(n + 1, sizeof(*chain));
        struct ps_sparse_rows scratch[MODEL_MAX_EMBEDDINGS] = {0};
        size_t k = 0, broken = i, used = 0;   /* chief_chain_of names the broken link only on -ENOENT */
        bool slots_loaded = false;
        int r = 0;
        if (!gone || !chain)
                r = errf(err, errlen, -ENOMEM, "out of memory");
        else if ((r = chief_chain_of(rows, n, gone, i, chain, &k, &broken)) < 0)
                r = errf(err, errlen, r == -ENOENT ? -ENOENT : -EBADMSG,
                         r == -ENOENT ? "checkpoint \"%s\" (global_step %" PRIu64 ") is incremental on global_step "
                                        "%" PRIu64 ", which is not recorded (the chain points nowhere)"
                                      : "checkpoint \"%s\" (global_step %" PRIu64 "): its chain never reaches a "
                                        "full checkpoint%.0" PRIu64,
                         rows[broken].path, rows[broken].global_step, rows[broken].parent_step);
        if (r >= 0) {
                pthread_mutex_lock(&s->mu);
                r = load_chain_locked(s, rows, gone, chain, k, false, params, NULL, &slots_loaded,
                                      tables ? scratch : NULL, NULL, &used, err, errlen);
                pthread_mutex_unlock(&s->mu);
        }
        for (uint32_t t = 0; r >= 0 && tables && t < MODEL_MAX_EMBEDDINGS; t++) {
                tables[t] = scratch[t];
                scratch[t] = (struct ps_sparse_rows){0};
        }
        for (uint32_t t = 0; t < MODEL_MAX_EMBEDDINGS; t++)
                ps_sparse_rows_clear(&scratch[t]);
        free(gone);
        free(chain);
        return r < 0 ? r : 0;
}

int chief_ckpt_read_chain(struct chief_ckpt *s, const struct chief_db_checkpoint *rows, size_t n, size_t i,
                          float *params, struct ps_sparse_rows *tables, char *err, size_t errlen) {
        assert(i < n);
        return read_chain(s, rows, n, i, params, tables, err, errlen);
}

int chief_ckpt_read_step(struct chief_ckpt *s, uint64_t global_step, float *params, struct ps_sparse_rows *tables,
                         struct chief_db_checkpoint *ret, char *err, size_t errlen) {
        struct chief_db_checkpoint *rows = NULL;
        size_t n = 0, i = 0;
        int r = chief_db_list_checkpoints(s->db, &rows, &n);
        if (r < 0)
                return errf(err, errlen, r, "cannot list the checkpoints: %s", strerror(-r));
        while (i < n && rows[i].global_step != global_step)
                i++;
        if (i == n)
                r = errf(err, errlen, -ENOENT, "no checkpoint of global_step %" PRIu64 " is recorded", global_step);
        else if ((r = read_chain(s, rows, n, i, params, tables, err, errlen)) >= 0)
                *ret = rows[i];
        free(rows);
        return r;
}
