/* src/io/st_header.c — the safetensors header: a strict JSON parser for the
 * one shape the format allows, and the dtype names.
 *
 * The header is a JSON object whose members are tensor entries
 *   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
 * and at most one "__metadata__": {"key": "value", ...} (strings only).
 * The parser follows RFC 8259 for what it accepts (whitespace, string
 * escapes with surrogate pairs, integers without leading zeros) and checks
 * that raw string bytes are well-formed UTF-8; anything else (other value
 * kinds, fractions, negative numbers, duplicate names or fields, unknown
 * fields, bytes after the object other than whitespace) is an error naming
 * the byte offset. It never recurses: the schema fixes the depth. */
#include "io.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct parser {
  const unsigned char *s;
  size_t n, i;
  char *err;
  size_t cap;
  bool failed;
} parser;

static bool fail(parser *p, const char *fmt, const char *detail) {
  if (!p->failed) {
    char what[160];
    snprintf(what, sizeof what, fmt, detail ? detail : "");
    snprintf(p->err, p->cap, "header byte %zu: %s", p->i, what);
  }
  p->failed = true;
  return false;
}

static void ws(parser *p) {
  while (p->i < p->n &&
         (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
    p->i++;
}

/* Skips whitespace and consumes c. */
static bool expect(parser *p, char c) {
  ws(p);
  if (p->i < p->n && p->s[p->i] == (unsigned char)c) {
    p->i++;
    return true;
  }
  char want[2] = {c, 0};
  return fail(p, p->i < p->n ? "expected '%s'" : "expected '%s', found the end of the header",
              want);
}

/* Skips whitespace; true (consumed) when the next byte is c. */
static bool accept(parser *p, char c) {
  ws(p);
  if (p->i < p->n && p->s[p->i] == (unsigned char)c) {
    p->i++;
    return true;
  }
  return false;
}

static void put_utf8(char *o, size_t *k, uint32_t cp) {
  if (cp < 0x80) {
    o[(*k)++] = (char)cp;
  } else if (cp < 0x800) {
    o[(*k)++] = (char)(0xc0 | cp >> 6);
    o[(*k)++] = (char)(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    o[(*k)++] = (char)(0xe0 | cp >> 12);
    o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[(*k)++] = (char)(0x80 | (cp & 0x3f));
  } else {
    o[(*k)++] = (char)(0xf0 | cp >> 18);
    o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[(*k)++] = (char)(0x80 | (cp & 0x3f));
  }
}

static int hex4(parser *p) {
  if (p->n - p->i < 4) return -1;
  int v = 0;
  for (int k = 0; k < 4; k++) {
    int c = p->s[p->i + (size_t)k], d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return -1;
    v = v * 16 + d;
  }
  p->i += 4;
  return v;
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629: no
 * overlong forms, no surrogates, at most U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  uint32_t cp, min;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0)
    len = 2, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0)
    len = 3, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0)
    len = 4, cp = c & 0x07, min = 0x10000;
  else
    return 0;
  if (n < len) return 0;
  for (size_t k = 1; k < len; k++) {
    if ((s[k] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[k] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

/* A JSON string (after whitespace) decoded into a new NUL-terminated string;
 * NULL on error (recorded). Decoded NUL characters are refused: names and
 * metadata are C strings. */
static char *string(parser *p) {
  if (!expect(p, '"')) return NULL;
  size_t start = p->i, cap = 0;
  /* the decoded string is never longer than its encoding */
  for (size_t j = start; j < p->n && p->s[j] != '"'; j++, cap++)
    if (p->s[j] == '\\') j++, cap++;
  char *o = malloc(cap + 1);
  if (!o) {
    fail(p, "out of memory%s", NULL);
    return NULL;
  }
  size_t k = 0;
  for (;;) {
    if (p->i >= p->n) {
      fail(p, "unterminated string%s", NULL);
      break;
    }
    unsigned c = p->s[p->i];
    if (c == '"') {
      p->i++;
      o[k] = 0;
      return o;
    }
    if (c < 0x20) {
      fail(p, "control character in a string%s", NULL);
      break;
    }
    if (c != '\\') {
      size_t len = utf8_len(p->s + p->i, p->n - p->i);
      if (!len) {
        fail(p, "invalid UTF-8 in a string%s", NULL);
        break;
      }
      memcpy(o + k, p->s + p->i, len);
      k += len, p->i += len;
      continue;
    }
    p->i++;
    if (p->i >= p->n) {
      fail(p, "unterminated string%s", NULL);
      break;
    }
    c = p->s[p->i++];
    const char *simple = strchr("\"\\/bfnrt", (int)c);
    if (c && simple) {
      static const char out_of[] = "\"\\/\b\f\n\r\t";
      o[k++] = out_of[simple - "\"\\/bfnrt"];
      continue;
    }
    if (c != 'u') {
      p->i--;
      fail(p, "invalid escape in a string%s", NULL);
      break;
    }
    int u = hex4(p);
    if (u < 0) {
      fail(p, "invalid \\u escape%s", NULL);
      break;
    }
    uint32_t cp = (uint32_t)u;
    if (cp >= 0xdc00 && cp <= 0xdfff) {
      fail(p, "unpaired surrogate in a \\u escape%s", NULL);
      break;
    }
    if (cp >= 0xd800 && cp <= 0xdbff) { /* a high surrogate: its low half must follow */
      int lo = -1;
      if (p->n - p->i >= 2 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
        p->i += 2;
        lo = hex4(p);
      }
      if (lo < 0xdc00 || lo > 0xdfff) {
        fail(p, "unpaired surrogate in a \\u escape%s", NULL);
        break;
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
    }
    if (cp == 0) {
      fail(p, "NUL character (\\u0000) in a string%s", NULL);
      break;
    }
    put_utf8(o, &k, cp); /* at most 4 bytes for 6 or 12 of escape */
  }
  free(o);
  return NULL;
}

/* A non-negative JSON integer (no sign, fraction or exponent) into *v;
 * *overflow when it exceeds INT64_MAX (the value is then clamped). */
static bool integer(parser *p, uint64_t *v, bool *overflow) {
  ws(p);
  if (p->i < p->n && p->s[p->i] == '-') return fail(p, "negative number%s", NULL);
  if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
    return fail(p, "expected an integer%s", NULL);
  if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
    return fail(p, "number with a leading zero%s", NULL);
  uint64_t x = 0;
  *overflow = false;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    unsigned d = p->s[p->i++] - '0';
    if (x > (uint64_t)(INT64_MAX - d) / 10)
      *overflow = true, x = (uint64_t)INT64_MAX;
    else
      x = x * 10 + d;
  }
  if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
    return fail(p, "number is not an integer%s", NULL);
  *v = x;
  return true;
}

static bool grow(void **a, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int c = *cap ? *cap * 2 : 8;
  while (c < need)
    c *= 2;
  void *q = realloc(*a, (size_t)c * elem);
  if (!q) return false;
  *a = q;
  *cap = c;
  return true;
}

static bool metadata(parser *p, nbi_st_header *hd) {
  if (!expect(p, '{')) return false;
  if (accept(p, '}')) return true;
  do {
    char *k = string(p);
    if (!k) return false;
    for (int j = 0; j < hd->n_meta; j++)
      if (!strcmp(hd->meta[2 * j], k)) {
        free(k);
        return fail(p, "duplicate __metadata__ key%s", NULL);
      }
    char *v = expect(p, ':') ? string(p) : NULL;
    if (!v || !grow((void **)&hd->meta, &hd->cap_meta, 2 * hd->n_meta + 2, sizeof(char *))) {
      free(k), free(v);
      return v ? fail(p, "out of memory%s", NULL) : false;
    }
    hd->meta[2 * hd->n_meta] = k;
    hd->meta[2 * hd->n_meta + 1] = v;
    hd->n_meta++;
  } while (accept(p, ','));
  return expect(p, '}');
}

static bool entry(parser *p, nbi_st_entry *e) {
  bool seen[3] = {false, false, false};
  if (!expect(p, '{')) return false;
  if (accept(p, '}')) return fail(p, "tensor entry has no \"dtype\"%s", NULL);
  do {
    char *f = string(p);
    if (!f) return false;
    int which = !strcmp(f, "dtype")          ? 0
                : !strcmp(f, "shape")        ? 1
                : !strcmp(f, "data_offsets") ? 2
                                             : -1;
    if (which < 0) {
      char shown[64];
      snprintf(shown, sizeof shown, "%.60s", f);
      free(f);
      return fail(p, "unknown field \"%s\" in a tensor entry", shown);
    }
    free(f);
    if (seen[which]) return fail(p, "duplicate field in a tensor entry%s", NULL);
    seen[which] = true;
    if (!expect(p, ':')) return false;
    if (which == 0) {
      char *d = string(p);
      if (!d) return false;
      snprintf(e->dtype, sizeof e->dtype, "%s", d);
      if (strlen(d) >= sizeof e->dtype) e->dtype[0] = '?'; /* too long: no dtype has it */
      free(d);
    } else if (which == 1) {
      if (!expect(p, '[')) return false;
      e->ndim = 0;
      if (!accept(p, ']')) {
        do {
          uint64_t v;
          bool ov;
          if (!integer(p, &v, &ov)) return false;
          if (ov) e->dims_overflow = true;
          if (e->ndim < NB_MAX_DIMS) e->dims[e->ndim] = (int64_t)v;
          if (e->ndim == INT32_MAX) return fail(p, "too many dimensions%s", NULL);
          e->ndim++;
        } while (accept(p, ','));
        if (!expect(p, ']')) return false;
      }
    } else {
      uint64_t v[2];
      bool ov[2];
      if (!expect(p, '[') || !integer(p, &v[0], &ov[0]) || !expect(p, ',') ||
          !integer(p, &v[1], &ov[1]))
        return false;
      if (!accept(p, ']')) return fail(p, "data_offsets must hold exactly two integers%s", NULL);
      if (ov[0] || ov[1]) return fail(p, "data offset beyond 2^63 - 1%s", NULL);
      e->begin = v[0], e->end = v[1];
    }
  } while (accept(p, ','));
  if (!expect(p, '}')) return false;
  if (!seen[0] || !seen[1] || !seen[2])
    return fail(p, "tensor entry lacks \"%s\"",
                !seen[0]   ? "dtype"
                : !seen[1] ? "shape"
                           : "data_offsets");
  return true;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const nbi_st_entry *const *)a)->name, (*(const nbi_st_entry *const *)b)->name);
}

bool nbi_st_parse(const char *h, size_t n, nbi_st_header *out, char *err, size_t cap) {
  parser p = {.s = (const unsigned char *)h, .n = n, .err = err, .cap = cap};
  memset(out, 0, sizeof *out);
  bool have_meta = false;
  if (!expect(&p, '{')) goto bad;
  if (!accept(&p, '}')) {
    do {
      ws(&p);
      size_t at = p.i;
      char *name = string(&p);
      if (!name) goto bad;
      if (!expect(&p, ':')) {
        free(name);
        goto bad;
      }
      if (!strcmp(name, "__metadata__")) {
        free(name);
        if (have_meta) {
          p.i = at;
          fail(&p, "duplicate __metadata__%s", NULL);
          goto bad;
        }
        have_meta = true;
        if (!metadata(&p, out)) goto bad;
        continue;
      }
      if (!grow((void **)&out->e, &out->cap, out->n + 1, sizeof *out->e)) {
        free(name);
        fail(&p, "out of memory%s", NULL);
        goto bad;
      }
      nbi_st_entry *e = &out->e[out->n++];
      memset(e, 0, sizeof *e);
      e->name = name;
      if (!entry(&p, e)) goto bad;
    } while (accept(&p, ','));
    if (!expect(&p, '}')) goto bad;
  }
  ws(&p);
  if (p.i != n) {
    fail(&p, "bytes after the header's object%s", NULL);
    goto bad;
  }
  if (out->n > 1) { /* duplicate names */
    nbi_st_entry **idx = malloc(sizeof *idx * (size_t)out->n);
    if (!idx) {
      fail(&p, "out of memory%s", NULL);
      goto bad;
    }
    for (int k = 0; k < out->n; k++)
      idx[k] = &out->e[k];
    qsort(idx, (size_t)out->n, sizeof *idx, by_name);
    for (int k = 1; k < out->n; k++)
      if (!strcmp(idx[k - 1]->name, idx[k]->name)) {
        snprintf(err, cap, "tensor \"%.200s\" appears twice", idx[k]->name);
        free(idx);
        nbi_st_header_free(out);
        return false;
      }
    free(idx);
  }
  return true;
bad:
  nbi_st_header_free(out);
  return false;
}

void nbi_st_header_free(nbi_st_header *hd) {
  for (int k = 0; k < hd->n; k++)
    free(hd->e[k].name);
  for (int k = 0; k < 2 * hd->n_meta; k++)
    free(hd->meta[k]);
  free(hd->e);
  free(hd->meta);
  memset(hd, 0, sizeof *hd);
}

/* ---- dtype names ------------------------------------------------------------------ */
static const char *const st_names[NB_DTYPE_COUNT] = {
    [NB_F32] = "F32", [NB_F64] = "F64",   [NB_F16] = "F16", [NB_BF16] = "BF16", [NB_I32] = "I32",
    [NB_I64] = "I64", [NB_BOOL] = "BOOL", [NB_U8] = "U8",   [NB_I8] = "I8",     [NB_I16] = "I16",
};

const char *nbi_st_dtype_str(nb_dtype dt) { return nbi_dtype_valid(dt) ? st_names[dt] : NULL; }

nb_dtype nbi_st_dtype_of(const char *s) {
  for (int d = 0; d < NB_DTYPE_COUNT; d++)
    if (st_names[d] && !strcmp(st_names[d], s)) return (nb_dtype)d;
  return NB_DTYPE_COUNT;
}

bool nbi_st_dtype_known(const char *s) {
  static const char *const others[] = {"U16",     "U32",     "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                       "F6_E2M3", "F6_E3M2", "F4",  "C64",     "E8M0"};
  for (size_t k = 0; k < sizeof others / sizeof others[0]; k++)
    if (!strcmp(others[k], s)) return true;
  return nbi_st_dtype_of(s) != NB_DTYPE_COUNT;
}
