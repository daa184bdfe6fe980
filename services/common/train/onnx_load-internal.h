/* What the ONNX loader's three files share (onnx_load.h is the contract): the loader's state and its
 * values (onnx_ld.c: errors, names, the file's tensors, constants, attributes), the folding of the
 * shape arithmetic exporters emit (onnx_fold.c), and turning nodes into the graph (onnx_load.c). Their
 * functions are prefixed ox_. Nothing else includes it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph-internal.h"
#include "onnx/onnx.pb-c.h"

#define OPSET_MIN 13
#define OPSET_MAX 17
/* An input's values per example: past this a model is refused rather than risk the products of its
 * dims (2^31 floats are 8 GiB an example). */
#define INPUT_MAX_VALUES ((int64_t)1 << 31)
/* A constant's dims, zeros counted as ones, multiply to at most this, so that no product of some of
 * them overflows; its data must be in the file anyway. */
#define CONST_MAX_SPAN ((size_t)1 << 40)
/* Values a node's output may hold an example: past this a model is refused, so that the shape functions
 * further on never multiply dims past int64 (2^40 floats are 4 TiB). */
#define NODE_MAX_VALUES ((int64_t)1 << 40)
/* Pad's pads, before the shape function adds them to dims. */
#define PAD_MAX ((int64_t)1 << 31)
/* Values a fold may make: shape arithmetic is small, and a hostile file must not grow it unbounded. */
#define FOLD_MAX_VALUES ((size_t)1 << 22)

/* ---- what the loader knows of each value (tensor name) of the file ---- */

enum vkind {
        V_INPUT,  /* a graph input: a GT_INPUT tensor */
        V_PARAM,  /* a float initializer: a GT_PARAM tensor once a node reads it as data */
        V_CONST,  /* an int initializer, a Constant node's value or a folded value: known at load time */
        V_NODE,   /* computed by a node of the graph (until the node folds: then V_CONST) */
};

struct val {
        const char *name;                /* the file's (in the unpacked model) */
        enum vkind kind;
        enum graph_dtype dtype;
        struct graph_shape shape;        /* V_PARAM, V_CONST (dims may be 0: an empty constant) */
        const Onnx__TensorProto *init;   /* V_PARAM: its values, read when it becomes a tensor */
        void *data;                      /* V_CONST: count values of dtype (owned) */
        uint8_t *batch;                  /* V_CONST int64: 1 where the value is the batch size (NULL: none) */
        size_t count;
        int32_t t;                       /* its tensor in the graph, -1 while none */
        int32_t producer;                /* the node (index in the file) that computes it, or -1 */
        uint32_t consumers;              /* node inputs that read it */
        bool output;                     /* a graph output */
        bool is_init;
        bool param_used;                 /* V_PARAM: a node reads it as data */
};

struct ld {
        const char *origin;
        char *err;
        size_t errlen;
        const Onnx__GraphProto *gp;
        struct graph *g;
        struct val *v;                   /* (n_v) */
        uint32_t n_v, cap_v;
        uint32_t *tab;                   /* names: index + 1 into v, 0 for a free slot (tab_cap a power of 2) */
        uint32_t tab_cap;
        uint32_t *onnx_of;               /* (graph nodes) each graph node's index in the file */
};

struct tmeta {
        int32_t type;                    /* the file's */
        enum graph_dtype dtype;
        struct graph_shape shape;
        size_t count;
};

/* ---- onnx_ld.c ---- */
const char *ox_str(const char *s);
int ox_fail(struct ld *L, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ox_node_fail(struct ld *L, uint32_t ni, int r, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
struct val *ox_find(const struct ld *L, const char *name);
struct val *ox_add_val(struct ld *L, const char *name, enum vkind kind);
int64_t ox_sat_mul(int64_t a, int64_t b);
const char *ox_type_name(int32_t t);
int ox_shape_count(const struct graph_shape *s, size_t *ret);
int ox_tensor_meta(const Onnx__TensorProto *tp, struct tmeta *m, char *why, size_t wl);
void ox_tensor_values(const Onnx__TensorProto *tp, const struct tmeta *m, void *out);
void ox_val_clear(struct val *v);
int ox_const_new(struct val *v, enum graph_dtype dt, const struct graph_shape *s, char *why, size_t wl);
void ox_const_trim(struct val *v);
bool ox_marked(const struct val *v, size_t i);
bool ox_any_marked(const struct val *v);
void ox_const_copy(struct val *o, size_t j, const struct val *a, size_t i, size_t n);
void ox_const_copy1(struct val *o, size_t j, const struct val *a, size_t i);
struct graph_shape ox_val_shape(const struct ld *L, const struct val *v);
int ox_val_tensor(struct ld *L, struct val *v, int32_t *ret, char *why, size_t wl);
const Onnx__AttributeProto *ox_attr_find(const Onnx__NodeProto *np, const char *name);
bool ox_attr_is(const Onnx__AttributeProto *a, Onnx__AttributeProto__AttributeType t);
int ox_attr_int(struct ld *L, uint32_t ni, const char *name, int64_t def, int64_t *ret);
int ox_attrs_only(struct ld *L, uint32_t ni, const char *const *names);

/* The attributes each op reads, by ONNX's name, into struct graph_attrs (onnx_load.c's table; onnx_save.c
 * writes them back from it). Read and ignored, as harmless:
 * BatchNormalization's training_mode (graph_forward's training decides), Dropout's seed (graph_forward's
 * seed decides), MaxPool's storage_order (it lays out the Indices output, which is not produced),
 * LayerNormalization's stash_type (the statistics' precision: float32 is the only one here). */
enum akind { AK_INT, AK_FLOAT, AK_INTS, AK_IGNORED };

struct attr_spec {
        const char *name;
        uint64_t ops;                    /* a bit per enum graph_op */
        enum akind kind;
        size_t off, n_off;               /* the field; AK_INTS: the array, and its count */
        uint32_t max;                    /* AK_INTS: capacity */
};

#define OPB(o) (1ull << (o))
#define POOLS (OPB(GOP_MAXPOOL) | OPB(GOP_AVGPOOL))
#define AINT(n, ops, f) { n, ops, AK_INT, offsetof(struct graph_attrs, f), 0, 0 }
#define AFLT(n, ops, f) { n, ops, AK_FLOAT, offsetof(struct graph_attrs, f), 0, 0 }
#define AINTS(n, ops, f, nf, max) \
        { n, ops, AK_INTS, offsetof(struct graph_attrs, f), offsetof(struct graph_attrs, nf), max }
#define AIGN(n, ops) { n, ops, AK_IGNORED, 0, 0, 0 }

extern const struct attr_spec onnx_attr_specs[];
extern const size_t onnx_n_attr_specs;

/* ---- onnx_fold.c ---- */
int ox_fold_constant(struct ld *L, uint32_t ni, struct val *o);
struct val *ox_node_in(struct ld *L, uint32_t ni, size_t i);
int ox_const_ints(struct ld *L, uint32_t ni, size_t slot, const char *what, uint32_t max, int64_t *out,
                      uint32_t *n_ret);
int ox_try_fold(struct ld *L, uint32_t ni);
