/* src/io/io.h — internal contract of src/io: the safetensors header parser
 * (st_header.c), shared by the loader (safetensors.c) and the checkpoints
 * (checkpoint.c). */
#ifndef NABLA_SRC_IO_IO_H
#define NABLA_SRC_IO_IO_H

#include "../core/nbi.h"

/* The safetensors format's limit on the JSON header (bytes). */
#define NBI_ST_MAX_HEADER 100000000ull

/* One tensor entry of a header, as written: its dtype string, shape and
 * byte offsets into the data buffer. */
typedef struct nbi_st_entry {
  char *name;     /* decoded, NUL-terminated (owned) */
  char dtype[16]; /* the dtype string ("F32"); longer strings are cut (and unknown) */
  int ndim;       /* may exceed NB_MAX_DIMS: dims holds the first NB_MAX_DIMS */
  int64_t dims[NB_MAX_DIMS];
  bool dims_overflow; /* a dimension beyond INT64_MAX */
  uint64_t begin, end;
} nbi_st_entry;

/* A parsed header: the entries in the order written, and the __metadata__
 * pairs (key, value alternating, 2 * n_meta strings, owned). */
typedef struct nbi_st_header {
  nbi_st_entry *e;
  int n, cap;
  char **meta;
  int n_meta, cap_meta;
} nbi_st_header;

/* Parses the JSON header h[0..n) strictly (RFC 8259 syntax, UTF-8, one
 * object of tensor entries {"dtype", "shape", "data_offsets"} and at most
 * one "__metadata__" object of strings; no duplicate names or fields, no
 * unknown fields; trailing whitespace allowed). On failure returns false
 * with a message naming the byte offset and the problem in err. */
bool nbi_st_parse(const char *h, size_t n, nbi_st_header *out, char *err, size_t cap);
void nbi_st_header_free(nbi_st_header *hd);

/* "F32", "BOOL", ... for a nabla dtype; NULL when safetensors has none. */
const char *nbi_st_dtype_str(nb_dtype dt);
/* The nabla dtype of a safetensors dtype string, or NB_DTYPE_COUNT. */
nb_dtype nbi_st_dtype_of(const char *s);
/* True for a dtype the format defines that nabla has no dtype for. */
bool nbi_st_dtype_known(const char *s);

#endif
