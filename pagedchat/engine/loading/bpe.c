/* A SentencePiece-style BPE tokenizer (Gemma's: spaces written as U+2581, byte fallback,
 * merges applied by rank), read from a tokenizer.json of exactly that shape; any other
 * tokenizer.json is refused, and pagedchat.engine.loading.text_tokenizer leaves it to the
 * tokenizers library. It returns the ids and text that library returns, from flat tables:
 * the library keeps each token and merge as hashed strings, several times the memory.
 *
 * Encoding: the text is split at added tokens (leftmost, then longest match); each piece
 * between them has its spaces replaced by U+2581 and becomes one word of characters (a
 * character missing from the vocabulary becomes its bytes' <0xHH> tokens), merged pair by
 * pair, lowest merge rank first and leftmost among equal ranks, as tokenizers' Word does. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t n_vocab, n_merges, n_added, bos_id;
    int32_t *offsets;   /* token id -> its bytes, blob[offsets[id], offsets[id + 1]) */
    char *blob;
    int32_t *merges;    /* rank -> left id, right id, merged id */
    int32_t *added;     /* the added tokens' ids (their text is their vocabulary entry) */
    int8_t *added_kind; /* token id -> 0 plain, 1 added, 2 added and special */
    int32_t *vocab_slots, *merge_slots, *added_slots; /* open addressing, -1 empty */
    uint32_t vocab_bits, merge_bits, added_bits;
    int32_t lengths[256][64]; /* first byte -> the added tokens' lengths, longest first */
    int32_t n_lengths[256];
    int32_t byte_ids[256], space_id;
} Bpe;

typedef struct { int32_t rank, pos, merged; } Merge;

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static uint32_t bits_for(int64_t count) {
    uint32_t bits = 4;
    while ((1LL << bits) < 2 * count) bits++;
    return bits;
}

static uint32_t hash_bytes(const char *text, int64_t len, uint32_t bits) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < len; i++) h = (h ^ (uint8_t)text[i]) * 1099511628211ULL;
    return (uint32_t)((h * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static uint32_t hash_pair(int32_t left, int32_t right, uint32_t bits) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static int same_text(const Bpe *t, int32_t id, const char *text, int64_t len) {
    return t->offsets[id + 1] - t->offsets[id] == len &&
           memcmp(t->blob + t->offsets[id], text, (size_t)len) == 0;
}

/* The slot holding an id whose text is ``text`` in ``slots``, or the empty slot ending its
 * probe. */
static uint32_t find_text(const Bpe *t, const int32_t *slots, uint32_t bits, const int32_t *ids,
                          const char *text, int64_t len) {
    uint32_t mask = (1u << bits) - 1, slot = hash_bytes(text, len, bits);
    while (slots[slot] >= 0 && !same_text(t, ids ? ids[slots[slot]] : slots[slot], text, len))
        slot = (slot + 1) & mask;
    return slot;
}

static int32_t vocab_id(const Bpe *t, const char *text, int64_t len) {
    return t->vocab_slots[find_text(t, t->vocab_slots, t->vocab_bits, NULL, text, len)];
}

int32_t bpe_token_id(const Bpe *t, const char *text, int64_t len) {
    int32_t added = t->added_slots[find_text(t, t->added_slots, t->added_bits, t->added, text,
                                             len)];
    return added >= 0 ? t->added[added] : vocab_id(t, text, len);
}

/* The slot holding the merge of (left, right), or the empty slot ending its probe. */
static uint32_t merge_slot(const Bpe *t, int32_t left, int32_t right) {
    uint32_t mask = (1u << t->merge_bits) - 1, slot = hash_pair(left, right, t->merge_bits);
    for (int32_t rank; (rank = t->merge_slots[slot]) >= 0; slot = (slot + 1) & mask)
        if (t->merges[3 * rank] == left && t->merges[3 * rank + 1] == right) break;
    return slot;
}

/* The rank of the merge of (left, right), -1 for none. */
static int32_t merge_rank(const Bpe *t, int32_t left, int32_t right) {
    return t->merge_slots[merge_slot(t, left, right)];
}

void bpe_free(Bpe *t) {
    if (t == NULL) return;
    free(t->offsets); free(t->blob); free(t->merges); free(t->added); free(t->added_kind);
    free(t->vocab_slots); free(t->merge_slots); free(t->added_slots);
    free(t);
}


/* ---- reading tokenizer.json ---- */

typedef struct { char *data; int64_t size, cap; } Buf;

static int push(Buf *b, const void *bytes, int64_t len) {
    if (b->size + len > b->cap) {
        int64_t cap = b->cap ? b->cap : 256;
        while (cap < b->size + len) cap *= 2;
        char *data = realloc(b->data, (size_t)cap);
        if (data == NULL) return 0;
        b->data = data, b->cap = cap;
    }
    if (len > 0) memcpy(b->data + b->size, bytes, (size_t)len);
    b->size += len;
    return 1;
}

static int push_ints(Buf *b, int32_t first, int32_t second, int32_t third, int32_t fourth,
                     int count) {
    int32_t values[4] = {first, second, third, fourth};
    return push(b, values, 4LL * count);
}

/* A cursor in the JSON text; ``ok`` falls to 0 at malformed text or a shape not handled. */
typedef struct { const char *at, *end; int ok; } Json;

static int next_is(Json *j, char c) {
    while (j->at < j->end && (*j->at == ' ' || *j->at == '\n' || *j->at == '\r' || *j->at == '\t'))
        j->at++;
    return j->ok && j->at < j->end && *j->at == c;
}

static int take(Json *j, char c) {
    if (!next_is(j, c)) return 0;
    j->at++;
    return 1;
}

static int need(Json *j, char c) {
    if (!take(j, c)) j->ok = 0;
    return j->ok;
}

static int hex4(Json *j, uint32_t *code) {
    *code = 0;
    for (int i = 0; i < 4; i++) {
        int digit = j->at + i < j->end ? hex_digit(j->at[i]) : -1;
        if (digit < 0) return 0;
        *code = 16 * *code + (uint32_t)digit;
    }
    j->at += 4;
    return 1;
}

static void put_utf8(Json *j, Buf *out, uint32_t code) {
    char bytes[4] = {(char)code};
    int len = 1;
    if (code >= 0x10000) {
        bytes[0] = (char)(0xF0 | code >> 18), bytes[1] = (char)(0x80 | (code >> 12 & 63));
        bytes[2] = (char)(0x80 | (code >> 6 & 63)), bytes[3] = (char)(0x80 | (code & 63)), len = 4;
    } else if (code >= 0x800) {
        bytes[0] = (char)(0xE0 | code >> 12), bytes[1] = (char)(0x80 | (code >> 6 & 63));
        bytes[2] = (char)(0x80 | (code & 63)), len = 3;
    } else if (code >= 0x80) {
        bytes[0] = (char)(0xC0 | code >> 6), bytes[1] = (char)(0x80 | (code & 63)), len = 2;
    }
    if (!push(out, bytes, len)) j->ok = 0;
}

/* A string's text, its escapes undone, appended to ``out``. */
static void string(Json *j, Buf *out) {
    static const char escaped[] = "\"\\/bfnrt", meant[] = "\"\\/\b\f\n\r\t";
    if (!need(j, '"')) return;
    while (j->ok) {
        const char *run = j->at;
        while (j->at < j->end && *j->at != '"' && *j->at != '\\') j->at++;
        if (j->at >= j->end || !push(out, run, j->at - run)) break;
        if (*j->at++ == '"') return;
        if (j->at >= j->end) break;
        char c = *j->at++;
        const char *simple = c ? strchr(escaped, c) : NULL;
        uint32_t code, low;
        if (simple != NULL) {
            if (!push(out, meant + (simple - escaped), 1)) j->ok = 0;
        } else if (c == 'u' && hex4(j, &code) && (code < 0xDC00 || code >= 0xE000)) {
            if (code >= 0xD800 && code < 0xDC00) {  /* a surrogate pair's high half */
                if (j->end - j->at < 2 || j->at[0] != '\\' || j->at[1] != 'u') break;
                j->at += 2;
                if (!hex4(j, &low) || low < 0xDC00 || low >= 0xE000) break;
                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            }
            put_utf8(j, out, code);
        } else {
            break;
        }
    }
    j->ok = 0;
}

static int64_t integer(Json *j) {
    int64_t value = 0;
    int negative = take(j, '-'), digits = 0;
    for (; j->at < j->end && *j->at >= '0' && *j->at <= '9' && value < INT32_MAX; digits++)
        value = 10 * value + (*j->at++ - '0');
    if (digits == 0 || value > INT32_MAX) j->ok = 0;
    return negative ? -value : value;
}

/* Any value, appended to ``out`` in a canonical text: no white space outside strings and
 * strings unescaped, so that a part of the file can be compared with the shape expected. */
static void value(Json *j, Buf *out, int depth) {
    char open = next_is(j, '{') ? '{' : next_is(j, '[') ? '[' : 0, close = open == '{' ? '}' : ']';
    if (!j->ok || j->at >= j->end || depth > 64) {
        j->ok = 0;
    } else if (open) {
        j->at++;
        push(out, &open, 1);
        if (!take(j, close)) {
            do {
                if (open == '{') {
                    push(out, "\"", 1), string(j, out), push(out, "\":", 2), need(j, ':');
                }
                value(j, out, depth + 1);
            } while (j->ok && take(j, ',') && push(out, ",", 1));
            need(j, close);
        }
        if (!push(out, &close, 1)) j->ok = 0;
    } else if (*j->at == '"') {
        push(out, "\"", 1), string(j, out);
        if (!push(out, "\"", 1)) j->ok = 0;
    } else {  /* a number, true, false or null */
        const char *start = j->at;
        while (j->at < j->end && *j->at && strchr("+-.0123456789abcdefghijklmnopqrstuvwxyzE", *j->at))
            j->at++;
        if (j->at == start || !push(out, start, j->at - start)) j->ok = 0;
    }
}

static int text_is(const Buf *text, const char *expected) {
    return text->size == (int64_t)strlen(expected) &&
           memcmp(text->data, expected, (size_t)text->size) == 0;
}

/* Whether the next value is ``expected``, in value()'s canonical text. */
static int value_is(Json *j, Buf *scratch, const char *expected) {
    scratch->size = 0;
    value(j, scratch, 0);
    return j->ok && text_is(scratch, expected);
}

static const char *find(const char *text, int64_t len, const char *needle, int64_t needle_len) {
    for (int64_t i = 0; i + needle_len <= len; i++)
        if (memcmp(text + i, needle, (size_t)needle_len) == 0) return text + i;
    return NULL;
}

static int is_key(const Buf *key, const char *name) {
    return key->size == (int64_t)strlen(name) && memcmp(key->data, name, (size_t)key->size) == 0;
}

/* The keys of an object, one at a time into ``key``: 0 after the last (call with ``first``
 * 1, then 0). */
static int next_key(Json *j, Buf *key, int first) {
    if (first && (!need(j, '{') || take(j, '}'))) return 0;
    if (!first && !take(j, ',')) {
        need(j, '}');
        return 0;
    }
    key->size = 0;
    string(j, key);
    return need(j, ':');
}

static const char NORMALIZER[] = "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
                                 "\"content\":\"\xe2\x96\x81\"}",
    SPLIT[] = "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":"
              "\"MergedWithPrevious\",\"invert\":false}",
    DECODER[] = "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                "{\"String\":\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
                "{\"type\":\"Fuse\"}]}",
    SINGLE[] = "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"",
    SINGLE_END[] = "\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],";

/* The post-processor's one token before the text (its name into ``bos``, its id the return
 * value), as TemplateProcessing writes it; -1 for another post-processor. */
static int32_t bos_of(Json *j, Buf *scratch, Buf *bos) {
    scratch->size = 0;
    value(j, scratch, 0);
    const char *text = scratch->data;
    int64_t len = scratch->size;
    if (!j->ok || len < (int64_t)sizeof SINGLE || memcmp(text, SINGLE, sizeof SINGLE - 1) != 0)
        return -1;
    const char *name = text + sizeof SINGLE - 1;
    const char *name_end = find(name, text + len - name, SINGLE_END, sizeof SINGLE_END - 1);
    if (name_end == NULL) return -1;
    bos->size = 0;  /* then "special_tokens":{..."NAME":{"id":"NAME","ids":[ID] */
    if (!push(bos, name, name_end - name)) return -1;
    Buf needle = {0};
    int ok = push(&needle, "\"", 1) && push(&needle, name, name_end - name) &&
             push(&needle, "\":{\"id\":\"", 9) && push(&needle, name, name_end - name) &&
             push(&needle, "\",\"ids\":[", 9);
    const char *at = ok ? find(name_end, text + len - name_end, needle.data, needle.size) : NULL;
    free(needle.data);
    if (at == NULL) return -1;
    Json ids = {at + needle.size, text + len, 1};
    int32_t id = (int32_t)integer(&ids);
    return ids.ok && take(&ids, ']') ? id : -1;
}

/* The added tokens: (id, special, where its text starts in ``texts``, its length) each. */
static void read_added(Json *j, Buf *key, Buf *added, Buf *texts) {
    if (!need(j, '[') || take(j, ']')) return;
    do {
        int32_t id = -1, special = -1, start = (int32_t)texts->size, len = -1;
        for (int first = 1; next_key(j, key, first); first = 0) {
            if (is_key(key, "id")) {
                id = (int32_t)integer(j);
            } else if (is_key(key, "content")) {
                string(j, texts);
                len = (int32_t)(texts->size - start);
            } else if (is_key(key, "special")) {
                special = value_is(j, key, "true");
            } else if (!value_is(j, key, "false")) {  /* single_word, lstrip, rstrip, normalized */
                j->ok = 0;
            }
        }
        if (id < 0 || len < 0 || special < 0 || !push_ints(added, id, special, start, len, 4))
            j->ok = 0;
    } while (j->ok && take(j, ','));
    need(j, ']');
}

/* The vocabulary object: token texts in id order (ids 0 to n - 1, each once), then the table
 * from text to id. */
static void read_vocab(Json *j, Bpe *t) {
    Buf texts = {0}, entries = {0};
    if (need(j, '{') && !take(j, '}')) {
        do {
            int32_t start = (int32_t)texts.size;
            string(j, &texts);
            need(j, ':');
            int32_t id = (int32_t)integer(j);
            if (!push_ints(&entries, id, start, (int32_t)texts.size - start, 0, 3)) j->ok = 0;
        } while (j->ok && take(j, ','));
        need(j, '}');
    }
    int32_t n = (int32_t)(entries.size / 12), *entry = (int32_t *)entries.data;
    t->n_vocab = n;
    t->offsets = calloc((size_t)n + 1, sizeof(int32_t));
    t->blob = malloc((size_t)texts.size + 1);
    int32_t *order = malloc(sizeof(int32_t) * ((size_t)n + 1));
    if (!t->offsets || !t->blob || !order || n == 0) j->ok = 0;
    for (int32_t i = 0; j->ok && i < n; i++) order[i] = -1;
    for (int32_t i = 0; j->ok && i < n; i++) {
        int32_t id = entry[3 * i];
        if (id < 0 || id >= n || order[id] >= 0) j->ok = 0;
        else order[id] = i;
    }
    for (int32_t id = 0; j->ok && id < n; id++) {
        const int32_t *e = entry + 3 * order[id];
        memcpy(t->blob + t->offsets[id], texts.data + e[1], (size_t)e[2]);
        t->offsets[id + 1] = t->offsets[id] + e[2];
    }
    free(texts.data), free(entries.data), free(order);
    if (!j->ok) return;
    t->vocab_bits = bits_for(n);
    t->vocab_slots = malloc(sizeof(int32_t) << t->vocab_bits);
    if (t->vocab_slots == NULL) { j->ok = 0; return; }
    memset(t->vocab_slots, -1, sizeof(int32_t) << t->vocab_bits);
    for (int32_t id = 0; id < n; id++) {
        uint32_t slot = find_text(t, t->vocab_slots, t->vocab_bits, NULL, t->blob + t->offsets[id],
                                  t->offsets[id + 1] - t->offsets[id]);
        if (t->vocab_slots[slot] < 0) t->vocab_slots[slot] = id;
    }
}

/* The merges, ["left", "right"] or "left right", as (left id, right id, merged id) by rank;
 * after the vocabulary, which holds every token they name (else tokenizers refuses them). */
static void read_merges(Json *j, Bpe *t, Buf *scratch, Buf *merges) {
    if (t->vocab_slots == NULL || !need(j, '[') || take(j, ']')) return;
    do {
        int64_t split = -1;
        scratch->size = 0;
        if (take(j, '[')) {
            string(j, scratch);
            split = scratch->size;
            need(j, ',');
            string(j, scratch);
            need(j, ']');
        } else {
            string(j, scratch);
            const char *space = memchr(scratch->data, ' ', (size_t)scratch->size);
            if (space != NULL) {
                split = space - scratch->data;
                memmove(scratch->data + split, scratch->data + split + 1,
                        (size_t)(scratch->size - split - 1));
                scratch->size--;
            }
        }
        int32_t left = split < 0 ? -1 : vocab_id(t, scratch->data, split),
                right = split < 0 ? -1 : vocab_id(t, scratch->data + split, scratch->size - split),
                merged = vocab_id(t, scratch->data, scratch->size);
        if (left < 0 || right < 0 || merged < 0 || !push_ints(merges, left, right, merged, 0, 3))
            j->ok = 0;
    } while (j->ok && take(j, ','));
    need(j, ']');
}

static void read_model(Json *j, Bpe *t, Buf *key, Buf *scratch, Buf *merges) {
    int required = 0;  /* "type": "BPE" and "byte_fallback": true */
    for (int first = 1; next_key(j, key, first); first = 0) {
        if (is_key(key, "type") || is_key(key, "byte_fallback")) {
            if (value_is(j, scratch, is_key(key, "type") ? "\"BPE\"" : "true")) required++;
            else j->ok = 0;  /* refused before the vocabulary is read */
        } else if (is_key(key, "dropout") || is_key(key, "continuing_subword_prefix") ||
                   is_key(key, "end_of_word_suffix") || is_key(key, "ignore_merges")) {
            if (!value_is(j, scratch, is_key(key, "ignore_merges") ? "false" : "null")) j->ok = 0;
        } else if (is_key(key, "unk_token") || is_key(key, "fuse_unk")) {
            value(j, scratch, 0);  /* unused: every byte has its <0xHH> token */
        } else if (is_key(key, "vocab")) {
            read_vocab(j, t);
        } else if (is_key(key, "merges")) {
            read_merges(j, t, scratch, merges);
        } else {
            j->ok = 0;
        }
    }
    if (required != 2) j->ok = 0;
}

/* The tokenizer of ``path``, a tokenizer.json: NULL where it cannot be read, or has another
 * shape than the one this file implements (another normalizer, pre-tokenizer, decoder or
 * post-processor, a BPE option, an added token that strips or matches normalized text, ids
 * not 0 to n - 1, a byte without its <0xHH> token). */
Bpe *bpe_load(const char *path) {
    FILE *file = fopen(path, "rb");
    if (file == NULL) return NULL;
    long size = fseek(file, 0, SEEK_END) == 0 ? ftell(file) : -1;
    char *text = size > 0 && fseek(file, 0, SEEK_SET) == 0 ? malloc((size_t)size) : NULL;
    int read = text != NULL && fread(text, 1, (size_t)size, file) == (size_t)size;
    fclose(file);
    Bpe *t = read ? calloc(1, sizeof(Bpe)) : NULL;
    Json j = {text, text + (read ? size : 0), t != NULL};
    Buf key = {0}, scratch = {0}, bos = {0}, added = {0}, added_texts = {0}, merges = {0};
    int parts = 0;  /* the normalizer and the decoder */
    if (t != NULL) t->bos_id = -1;
    for (int first = 1; next_key(&j, &key, first); first = 0) {
        if (is_key(&key, "added_tokens")) {
            read_added(&j, &scratch, &added, &added_texts);
        } else if (is_key(&key, "normalizer") || is_key(&key, "decoder")) {
            if (!value_is(&j, &scratch, is_key(&key, "decoder") ? DECODER : NORMALIZER)) j.ok = 0;
            parts++;
        } else if (is_key(&key, "pre_tokenizer")) {  /* after the normalizer, a split finds none */
            scratch.size = 0;
            value(&j, &scratch, 0);
            if (!text_is(&scratch, "null") && !text_is(&scratch, SPLIT)) j.ok = 0;
        } else if (is_key(&key, "post_processor")) {
            t->bos_id = bos_of(&j, &scratch, &bos);
        } else if (is_key(&key, "model")) {
            read_model(&j, t, &key, &scratch, &merges);
        } else if (is_key(&key, "version") || is_key(&key, "truncation") ||
                   is_key(&key, "padding")) {
            value(&j, &scratch, 0);  /* pagedchat sets neither truncation nor padding */
        } else {
            j.ok = 0;
        }
    }
    int ok = j.ok && parts == 2 && t->vocab_slots != NULL && t->bos_id >= 0 &&
             t->bos_id < t->n_vocab && same_text(t, t->bos_id, bos.data, bos.size);
    if (ok) {
        t->n_merges = (int32_t)(merges.size / 12), t->merges = (int32_t *)merges.data;
        merges.data = NULL;
        t->n_added = (int32_t)(added.size / 16);
        t->merge_bits = bits_for(t->n_merges), t->added_bits = bits_for(t->n_added);
        t->merge_slots = malloc(sizeof(int32_t) << t->merge_bits);
        t->added_slots = malloc(sizeof(int32_t) << t->added_bits);
        t->added = malloc(sizeof(int32_t) * ((size_t)t->n_added + 1));
        t->added_kind = calloc((size_t)t->n_vocab, 1);
        ok = t->merge_slots && t->added_slots && t->added && t->added_kind;
    }
    if (ok) {
        memset(t->merge_slots, -1, sizeof(int32_t) << t->merge_bits);
        memset(t->added_slots, -1, sizeof(int32_t) << t->added_bits);
        /* a pair's later listing wins, as in the library's map */
        for (int32_t rank = 0; rank < t->n_merges; rank++)
            t->merge_slots[merge_slot(t, t->merges[3 * rank], t->merges[3 * rank + 1])] = rank;
    }
    for (int32_t i = 0; ok && i < t->n_added; i++) {
        const int32_t *entry = (const int32_t *)added.data + 4 * i;
        int32_t id = entry[0], len = entry[3], known = 0;
        /* an added token's text is its vocabulary entry's */
        ok = id >= 0 && id < t->n_vocab && same_text(t, id, added_texts.data + entry[2], len);
        if (!ok) break;
        t->added[i] = id;
        t->added_kind[id] = entry[1] ? 2 : 1;
        if (len == 0) continue;  /* an empty added token matches nothing */
        int32_t first = (uint8_t)t->blob[t->offsets[id]];
        uint32_t slot = find_text(t, t->added_slots, t->added_bits, t->added,
                                  t->blob + t->offsets[id], len);
        if (t->added_slots[slot] < 0) t->added_slots[slot] = i;
        for (int32_t k = 0; k < t->n_lengths[first]; k++) known |= t->lengths[first][k] == len;
        ok = known || t->n_lengths[first] < 64;
        if (ok && !known) {  /* kept longest first */
            int32_t k = t->n_lengths[first]++;
            for (; k > 0 && t->lengths[first][k - 1] < len; k--)
                t->lengths[first][k] = t->lengths[first][k - 1];
            t->lengths[first][k] = len;
        }
    }
    if (ok) {
        char name[8];
        for (int b = 0; ok && b < 256; b++) {
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_ids[b] = vocab_id(t, name, 6);
            ok = t->byte_ids[b] >= 0;
        }
        t->space_id = vocab_id(t, "\xe2\x96\x81", 3);
    }
    free(text), free(key.data), free(scratch.data), free(bos.data), free(added.data);
    free(added_texts.data), free(merges.data);
    if (!ok) {
        bpe_free(t);
        return NULL;
    }
    return t;
}

static int32_t added_at(const Bpe *t, const char *text, int64_t left, int32_t *len) {
    int32_t first = (uint8_t)text[0];
    for (int32_t j = 0; j < t->n_lengths[first]; j++) {
        *len = t->lengths[first][j];
        if (*len > left) continue;
        int32_t found = t->added_slots[find_text(t, t->added_slots, t->added_bits, t->added,
                                                 text, *len)];
        if (found >= 0) return found;
    }
    return -1;
}

static void heap_push(Merge *heap, int64_t *size, Merge merge) {
    int64_t i = (*size)++;
    for (; i > 0; i = (i - 1) / 2) {
        Merge parent = heap[(i - 1) / 2];
        if (parent.rank < merge.rank || (parent.rank == merge.rank && parent.pos < merge.pos)) break;
        heap[i] = parent;
    }
    heap[i] = merge;
}

static Merge heap_pop(Merge *heap, int64_t *size) {
    Merge top = heap[0], last = heap[--(*size)];
    int64_t i = 0;
    for (int64_t child; (child = 2 * i + 1) < *size; i = child) {
        if (child + 1 < *size && (heap[child + 1].rank < heap[child].rank ||
            (heap[child + 1].rank == heap[child].rank && heap[child + 1].pos < heap[child].pos)))
            child++;
        if (last.rank < heap[child].rank ||
            (last.rank == heap[child].rank && last.pos <= heap[child].pos)) break;
        heap[i] = heap[child];
    }
    heap[i] = last;
    return top;
}

static void push_pair(const Bpe *t, Merge *heap, int64_t *size, const int32_t *symbol,
                      int64_t pos, int64_t next) {
    int32_t rank = merge_rank(t, symbol[pos], symbol[next]);
    if (rank >= 0) heap_push(heap, size, (Merge){rank, (int32_t)pos, t->merges[3 * rank + 2]});
}

/* One piece of text between added tokens as ids into ``out``; returns their count, or -1
 * where memory ran out. A byte of text makes at most 3 symbols (a space without its own
 * token, as U+2581's bytes). */
static int64_t encode_piece(const Bpe *t, const char *text, int64_t len, int32_t *out) {
    if (len == 0) return 0;
    int32_t *symbol = malloc(sizeof(int32_t) * 3 * (size_t)len);
    int64_t count = symbol == NULL ? -1 : 0, size = 0;
    for (int64_t i = 0; count >= 0 && i < len;) {
        uint8_t lead = (uint8_t)text[i];
        int64_t width = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
        if (i + width > len) width = len - i;
        int32_t id = text[i] == ' ' ? t->space_id
                     : t->vocab_slots[find_text(t, t->vocab_slots, t->vocab_bits, NULL,
                                                text + i, width)];
        if (id >= 0) {
            symbol[count++] = id;
        } else {  /* byte fallback: the character's bytes, U+2581's for a space */
            const char *bytes = text[i] == ' ' ? "\xe2\x96\x81" : text + i;
            for (int64_t b = 0; b < (text[i] == ' ' ? 3 : width); b++)
                symbol[count++] = t->byte_ids[(uint8_t)bytes[b]];
        }
        i += width;
    }
    /* each merge pushes at most two pairs: 3 entries a symbol hold every push */
    int64_t *prev = malloc(sizeof(int64_t) * (size_t)(count + 1));
    int64_t *next = malloc(sizeof(int64_t) * (size_t)(count + 1));
    Merge *heap = malloc(sizeof(Merge) * 3 * (size_t)(count + 1));
    if (!prev || !next || !heap) count = -1;
    for (int64_t i = 0; i < count; i++) prev[i] = i - 1, next[i] = i + 1 < count ? i + 1 : -1;
    for (int64_t i = 0; i + 1 < count; i++) push_pair(t, heap, &size, symbol, i, i + 1);
    while (size > 0) {
        Merge top = heap_pop(heap, &size);
        int64_t pos = top.pos, right = next[pos];
        /* a stale entry: its left symbol merged away, or its pair is no longer there */
        if (symbol[pos] < 0 || right < 0) continue;
        int32_t rank = merge_rank(t, symbol[pos], symbol[right]);
        if (rank < 0 || t->merges[3 * rank + 2] != top.merged) continue;
        symbol[pos] = top.merged;
        symbol[right] = -1;
        next[pos] = next[right];
        if (next[right] >= 0) prev[next[right]] = pos;
        if (prev[pos] >= 0) push_pair(t, heap, &size, symbol, prev[pos], pos);
        if (next[pos] >= 0) push_pair(t, heap, &size, symbol, pos, next[pos]);
    }
    int64_t written = 0;
    for (int64_t i = 0; i < count; i++)
        if (symbol[i] >= 0) out[written++] = symbol[i];
    free(symbol); free(prev); free(next); free(heap);
    return count < 0 ? -1 : written;
}

/* ``text``'s ids into ``out`` (room for len + 1), the bos id first where ``add_bos`` asks and
 * the tokenizer has one; returns the count, or -1 where memory ran out. */
int64_t bpe_encode(const Bpe *t, const char *text, int64_t len, int32_t add_bos, int32_t *out) {
    int64_t count = 0, start = 0, piece;
    if (add_bos && t->bos_id >= 0) out[count++] = t->bos_id;
    for (int64_t i = 0; i < len;) {
        int32_t match_len, found = added_at(t, text + i, len - i, &match_len);
        if (found < 0) { i++; continue; }
        if ((piece = encode_piece(t, text + start, i - start, out + count)) < 0) return -1;
        count += piece;
        out[count++] = t->added[found];
        i += match_len, start = i;
    }
    if ((piece = encode_piece(t, text + start, len - start, out + count)) < 0) return -1;
    return count + piece;
}

/* One more byte of a UTF-8 check: *state holds how many continuation bytes are due
 * (bits 0-1) and the range the next one must lie in (bits 8-15, 16-23); -1 once invalid. */
static void utf8_step(int32_t *state, uint8_t c) {
    int32_t due = *state & 3, low = (*state >> 8) & 0xFF, high = (*state >> 16) & 0xFF;
    if (*state < 0) return;
    if (due > 0) {
        *state = c < low || c > high ? -1 : due == 1 ? 0 : (due - 1) | 0x80 << 8 | 0xBF << 16;
        return;
    }
    *state = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 | 0x80 << 8 | 0xBF << 16
             : c == 0xE0 ? 2 | 0xA0 << 8 | 0xBF << 16 : c == 0xED ? 2 | 0x80 << 8 | 0x9F << 16
             : c >= 0xE1 && c <= 0xEF ? 2 | 0x80 << 8 | 0xBF << 16
             : c == 0xF0 ? 3 | 0x90 << 8 | 0xBF << 16 : c == 0xF4 ? 3 | 0x80 << 8 | 0x8F << 16
             : c >= 0xF1 && c <= 0xF3 ? 3 | 0x80 << 8 | 0xBF << 16 : -1;
}

static void put(char *out, int64_t cap, int64_t *at, const char *bytes, int64_t len) {
    if (*at + len <= cap) memcpy(out + *at, bytes, (size_t)len);
    *at += len;
}

/* The byte a <0xHH> token stands for, -1 for another token. */
static int byte_of(const Bpe *t, int32_t id) {
    const char *text = t->blob + t->offsets[id];
    if (t->offsets[id + 1] - t->offsets[id] != 6 || memcmp(text, "<0x", 3) != 0 || text[5] != '>')
        return -1;
    int high = hex_digit(text[3]), low = hex_digit(text[4]);
    return high < 0 || low < 0 ? -1 : 16 * high + low;
}

/* The text of ``ids`` into ``out``, as tokenizers' Replace(U+2581 -> space), ByteFallback and
 * Fuse decoders give it: unknown ids are left out, special ones too where ``skip_special``; a
 * run of <0xHH> tokens is its bytes where they are UTF-8, else one U+FFFD per byte. Returns
 * the text's length in bytes, written only where it fits in ``cap``. */
int64_t bpe_decode(const Bpe *t, const int32_t *ids, int64_t n, int32_t skip_special, char *out,
                   int64_t cap) {
    int64_t at = 0;
#define LEFT_OUT(id) ((id) < 0 || (id) >= t->n_vocab || (skip_special && t->added_kind[id] == 2))
    for (int64_t k = 0; k < n;) {
        if (LEFT_OUT(ids[k])) { k++; continue; }
        if (byte_of(t, ids[k]) >= 0) {  /* a run of byte tokens; ids left out do not end it */
            int64_t end = k;
            int32_t state = 0;
            for (; end < n && (LEFT_OUT(ids[end]) || byte_of(t, ids[end]) >= 0); end++)
                if (!LEFT_OUT(ids[end])) utf8_step(&state, (uint8_t)byte_of(t, ids[end]));
            for (; k < end; k++) {
                if (LEFT_OUT(ids[k])) continue;
                char byte = (char)byte_of(t, ids[k]);
                if (state == 0) put(out, cap, &at, &byte, 1);
                else put(out, cap, &at, "\xef\xbf\xbd", 3);
            }
            continue;
        }
        const char *text = t->blob + t->offsets[ids[k]];
        int64_t len = t->offsets[ids[k] + 1] - t->offsets[ids[k]];
        for (int64_t i = 0; i < len;) {
            int space = i + 3 <= len && memcmp(text + i, "\xe2\x96\x81", 3) == 0;
            put(out, cap, &at, space ? " " : text + i, 1);
            i += space ? 3 : 1;
        }
        k++;
    }
#undef LEFT_OUT
    return at;
}

/* Token ``id``'s text (``*len`` bytes), NULL for an id outside the vocabulary. */
const char *bpe_token(const Bpe *t, int32_t id, int32_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->blob + t->offsets[id];
}

int32_t bpe_size(const Bpe *t) { return t->n_vocab; }
