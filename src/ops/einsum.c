/* src/ops/einsum.c — nb_einsum and nb_outer, composed from permute, reshape,
 * slice, sum, matmul and mul (so autodiff and transforms need no rule of their own).
 *
 * Einsum plan (NumPy's unoptimized left-to-right order):
 *  1. per operand: take diagonals of repeated letters ("ii->i"), then sum away the
 *     letters no other operand and not the output uses;
 *  2. contract the running result with the next operand as one batched matmul:
 *     A -> [batch, a_only, contracted], B -> [batch, contracted, b_only];
 *  3. sum letters the output lacks and permute to the output order.
 * Letters must have one size everywhere (no implicit broadcasting, no ellipsis). */
#include "../core/nbi.h"

#include <ctype.h>

#define EINSUM_MAX_OPERANDS 16

typedef struct term {
  nb_tensor *t;
  int n;                     /* rank == number of letters */
  char letters[NB_MAX_DIMS]; /* letter of each dim */
} term;

static int letter_count(const char *s, int n, char c) {
  int k = 0;
  for (int i = 0; i < n; i++)
    k += s[i] == c;
  return k;
}

/* Collapses two dims i < j of equal size into their diagonal, placed at i. */
static bool take_diagonal(term *x, int i, int j) {
  int n = x->n;
  nb_axes perm = {.n = n};
  int k = 0;
  for (int d = 0; d < n; d++)
    if (d != i && d != j) perm.v[k++] = d;
  perm.v[k++] = i;
  perm.v[k++] = j;
  nb_shape s = nb_shape_of(x->t);
  int64_t size = s.dims[i];
  nb_tensor *p = nb_permute(x->t, perm);
  nb_shape flat = {.ndim = n - 1};
  for (int d = 0; d < n - 2; d++)
    flat.dims[d] = s.dims[perm.v[d]];
  flat.dims[n - 2] = size * size;
  nb_tensor *f = nb_reshape(p, flat);
  int64_t starts[NB_MAX_DIMS] = {0}, stops[NB_MAX_DIMS], steps[NB_MAX_DIMS];
  for (int d = 0; d < n - 1; d++)
    stops[d] = NB_END, steps[d] = 1;
  steps[n - 2] = size + 1;
  nb_tensor *diag = nb_slice(f, starts, stops, steps); /* [..others, size] */
  if (!diag) return false;
  /* move the diagonal back to position i */
  char letters[NB_MAX_DIMS];
  k = 0;
  for (int d = 0; d < n; d++)
    if (d != i && d != j) letters[k++] = x->letters[d];
  nb_axes back = {.n = n - 1};
  for (int d = 0, src = 0; d < n - 1; d++)
    back.v[d] = d == i ? n - 2 : src++;
  char out_letters[NB_MAX_DIMS];
  for (int d = 0, src = 0; d < n - 1; d++)
    out_letters[d] = d == i ? x->letters[i] : letters[src++];
  x->t = nb_permute(diag, back);
  x->n = n - 1;
  memcpy(x->letters, out_letters, sizeof out_letters);
  return x->t != NULL;
}

/* Sums away the dims whose letters are not in keep. */
static bool sum_unkept(term *x, const char *keep, int n_keep) {
  nb_axes ax = {.n = 0};
  char left[NB_MAX_DIMS];
  int n_left = 0;
  for (int d = 0; d < x->n; d++) {
    if (letter_count(keep, n_keep, x->letters[d]))
      left[n_left++] = x->letters[d];
    else
      ax.v[ax.n++] = d;
  }
  if (ax.n == 0) return true;
  x->t = nb_sum(x->t, ax, false);
  x->n = n_left;
  memcpy(x->letters, left, sizeof left);
  return x->t != NULL;
}

/* Position of letter c among x's dims (c is known to be there). */
static int pos(const term *x, char c) {
  for (int d = 0; d < x->n; d++)
    if (x->letters[d] == c) return d;
  return -1;
}

static int64_t letter_size(const term *x, char c) { return nb_shape_of(x->t).dims[pos(x, c)]; }

/* Contracts a with b into out; letters in keep survive, shared ones not in keep
 * are summed. */
static bool contract(const term *a, const term *b, const char *keep, int n_keep, term *out) {
  char batch[NB_MAX_DIMS], ka[NB_MAX_DIMS], kb[NB_MAX_DIMS], con[NB_MAX_DIMS];
  int nb = 0, na = 0, nbo = 0, nc = 0;
  for (int d = 0; d < a->n; d++) {
    char c = a->letters[d];
    bool in_b = letter_count(b->letters, b->n, c), kept = letter_count(keep, n_keep, c);
    if (in_b && kept)
      batch[nb++] = c;
    else if (in_b)
      con[nc++] = c;
    else
      ka[na++] = c;
  }
  for (int d = 0; d < b->n; d++)
    if (!letter_count(a->letters, a->n, b->letters[d])) kb[nbo++] = b->letters[d];
  if (nb + na + nbo > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_einsum: an intermediate result would have %d dims (at most %d)",
              nb + na + nbo, NB_MAX_DIMS);
    return false;
  }
  nb_axes pa = {.n = a->n}, pb = {.n = b->n};
  int64_t B = 1, M = 1, K = 1, N = 1;
  int k = 0;
  for (int i = 0; i < nb; i++)
    pa.v[k++] = pos(a, batch[i]), B *= letter_size(a, batch[i]);
  for (int i = 0; i < na; i++)
    pa.v[k++] = pos(a, ka[i]), M *= letter_size(a, ka[i]);
  for (int i = 0; i < nc; i++)
    pa.v[k++] = pos(a, con[i]), K *= letter_size(a, con[i]);
  k = 0;
  for (int i = 0; i < nb; i++)
    pb.v[k++] = pos(b, batch[i]);
  for (int i = 0; i < nc; i++)
    pb.v[k++] = pos(b, con[i]);
  for (int i = 0; i < nbo; i++)
    pb.v[k++] = pos(b, kb[i]), N *= letter_size(b, kb[i]);
  nb_tensor *am = nb_reshape(nb_permute(a->t, pa), NB_SHAPE(B, M, K));
  nb_tensor *bm = nb_reshape(nb_permute(b->t, pb), NB_SHAPE(B, K, N));
  nb_shape os = {.ndim = nb + na + nbo};
  k = 0;
  for (int i = 0; i < nb; i++)
    out->letters[k] = batch[i], os.dims[k++] = letter_size(a, batch[i]);
  for (int i = 0; i < na; i++)
    out->letters[k] = ka[i], os.dims[k++] = letter_size(a, ka[i]);
  for (int i = 0; i < nbo; i++)
    out->letters[k] = kb[i], os.dims[k++] = letter_size(b, kb[i]);
  out->n = k;
  out->t = nb_reshape(nb_matmul(am, bm), os);
  return out->t != NULL;
}

/* Parses spec into per-operand letters and the output letters; validates
 * ranks and sizes against the operands. */
static nb_status parse_spec(const char *spec, nb_tensor *const *ts, int n, term *terms, char *out,
                            int *n_out) {
  const char *p = spec;
  int64_t size_of[128];
  for (int c = 0; c < 128; c++)
    size_of[c] = -1;
  for (int i = 0; i < n; i++) {
    terms[i] = (term){.t = ts[i]};
    while (*p == ' ')
      p++;
    while (isalpha((unsigned char)*p)) {
      if (terms[i].n == NB_MAX_DIMS)
        return nbi_error(NB_ERR_ARG, "nb_einsum: operand %d has more than %d letters in \"%s\"", i,
                         NB_MAX_DIMS, spec);
      terms[i].letters[terms[i].n++] = *p++;
    }
    while (*p == ' ')
      p++;
    nb_shape s = nb_shape_of(ts[i]);
    if (terms[i].n != s.ndim) {
      char b[160];
      return nbi_error(NB_ERR_SHAPE, "nb_einsum: operand %d has %d letters in \"%s\" but shape %s",
                       i, terms[i].n, spec, nb_shape_str(s, b, sizeof b));
    }
    for (int d = 0; d < s.ndim; d++) {
      int c = terms[i].letters[d];
      if (size_of[c] >= 0 && size_of[c] != s.dims[d])
        return nbi_error(NB_ERR_SHAPE, "nb_einsum: letter '%c' has sizes %lld and %lld in \"%s\"",
                         c, (long long)size_of[c], (long long)s.dims[d], spec);
      size_of[c] = s.dims[d];
    }
    if (i + 1 < n) {
      if (*p != ',')
        return nbi_error(NB_ERR_ARG, "nb_einsum: \"%s\" names fewer operands than the %d given",
                         spec, n);
      p++;
    }
  }
  *n_out = 0;
  if (p[0] == '-' && p[1] == '>') {
    p += 2;
    while (*p == ' ')
      p++;
    while (isalpha((unsigned char)*p)) {
      char c = *p++;
      if (size_of[(int)c] < 0)
        return nbi_error(NB_ERR_ARG, "nb_einsum: output letter '%c' is in no operand of \"%s\"", c,
                         spec);
      if (letter_count(out, *n_out, c))
        return nbi_error(NB_ERR_ARG, "nb_einsum: output letter '%c' repeats in \"%s\"", c, spec);
      if (*n_out == NB_MAX_DIMS)
        return nbi_error(NB_ERR_ARG, "nb_einsum: more than %d output letters", NB_MAX_DIMS);
      out[(*n_out)++] = c;
    }
    while (*p == ' ')
      p++;
  } else { /* implicit output: letters used exactly once, in ASCII order */
    for (int c = 'A'; c <= 'z'; c++) {
      int count = 0;
      for (int i = 0; i < n; i++)
        count += letter_count(terms[i].letters, terms[i].n, (char)c);
      if (count == 1 && *n_out < NB_MAX_DIMS) out[(*n_out)++] = (char)c;
    }
  }
  if (*p != '\0')
    return nbi_error(NB_ERR_ARG,
                     "nb_einsum: unexpected '%c' in \"%s\" (or more operands named "
                     "than the %d given)",
                     *p, spec, n);
  return NB_OK;
}

nb_tensor *nb_einsum(const char *spec, nb_tensor *const *ts, int n) {
  if (!spec || !ts) {
    nbi_error(NB_ERR_NULL, "nb_einsum: %s is NULL", spec ? "ts" : "spec");
    return NULL;
  }
  if (n < 1 || n > EINSUM_MAX_OPERANDS) {
    nbi_error(NB_ERR_ARG, "nb_einsum: %d operands (1 to %d)", n, EINSUM_MAX_OPERANDS);
    return NULL;
  }
  if (nbi_any_null("nb_einsum", ts, n)) return NULL;
  term terms[EINSUM_MAX_OPERANDS];
  char out[NB_MAX_DIMS];
  int n_out = 0;
  if (parse_spec(spec, ts, n, terms, out, &n_out)) return NULL;

  /* letters still needed after operand i: the output's and those of later operands */
  for (int i = 0; i < n; i++) {
    term *x = &terms[i];
    for (int d = 0; d < x->n; d++)
      for (int e = d + 1; e < x->n; e++)
        if (x->letters[e] == x->letters[d]) {
          if (!take_diagonal(x, d, e)) return NULL;
          e = d; /* rescan after the dims shifted */
        }
  }
  term acc = terms[0];
  for (int i = 0; i < n; i++) {
    char keep[EINSUM_MAX_OPERANDS * NB_MAX_DIMS + NB_MAX_DIMS];
    int n_keep = 0;
    for (int d = 0; d < n_out; d++)
      keep[n_keep++] = out[d];
    for (int j = i + 1; j < n; j++)
      for (int d = 0; d < terms[j].n; d++)
        keep[n_keep++] = terms[j].letters[d];
    if (i == 0) {
      if (!sum_unkept(&acc, keep, n_keep)) return NULL;
      continue;
    }
    /* the new operand's private letters go first, then one contraction */
    term b = terms[i];
    for (int d = 0; d < acc.n; d++)
      keep[n_keep++] = acc.letters[d];
    if (!sum_unkept(&b, keep, n_keep)) return NULL;
    n_keep -= acc.n;
    term next;
    if (!contract(&acc, &b, keep, n_keep, &next)) return NULL;
    acc = next;
  }
  nb_axes perm = {.n = n_out};
  for (int d = 0; d < n_out; d++)
    perm.v[d] = pos(&acc, out[d]);
  return nb_permute(acc.t, perm);
}

nb_tensor *nb_outer(nb_tensor *a, nb_tensor *b) {
  if (nbi_any_null("nb_outer", (nb_tensor *[]){a, b}, 2)) return NULL;
  int64_t m = nb_numel(a), n = nb_numel(b);
  return nb_mul(nb_reshape(a, NB_SHAPE(m, 1)), nb_reshape(b, NB_SHAPE(1, n)));
}
