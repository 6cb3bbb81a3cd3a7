#!/usr/bin/python3
"""Byte-level BPE for the small Clover model (GPT-2 byte map, Qwen3.5 pre-tokenizer).

Pre-tokenizer: the qwen35 pattern of architecture.md §5.2,
  (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}
  | ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+
Python's `re` has no \\p{..}; for ASCII text \\p{L} = [A-Za-z], \\p{N} = [0-9], \\p{M} is empty and
\\s = [ \\t\\n\\v\\f\\r], so the pattern below is EXACT on ASCII input (the training text is ASCII only,
see data.py). On non-ASCII input this splitter treats every non-ASCII character as punctuation
(an approximation; the C++ tokenizer is the authority there).
Vocabulary: ids 0..255 are the 256 byte tokens in byte order (GPT-2 byte->unicode map), then one
token per merge in merge order, then the special tokens (token_type 3 = control).
"""
import collections
import json
import re

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"]

_S = " \\t\\n\\v\\f\\r"
PAT = re.compile(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    r"|[^\r\nA-Za-z0-9]?[A-Za-z]+"
    r"|[0-9]"
    r"| ?[^" + _S + r"A-Za-z0-9]+[\r\n]*"
    r"|[" + _S + r"]*[\r\n]+"
    r"|[" + _S + r"]+(?![^" + _S + r"])"
    r"|[" + _S + r"]+"
)


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


BYTE_ENC = bytes_to_unicode()
BYTE_DEC = {v: k for k, v in BYTE_ENC.items()}


def pretokenize(text):
    return PAT.findall(text)


def to_symbols(piece):
    return "".join(BYTE_ENC[b] for b in piece.encode("utf-8"))


def train_bpe(texts, n_merges, log=None):
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: smallest pair)."""
    counts = collections.Counter()
    for t in texts:
        counts.update(pretokenize(t))
    words = [list(to_symbols(w)) for w in counts]
    freqs = [counts[w] for w in counts]
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, (w, f) in enumerate(zip(words, freqs)):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += f
            where[(a, b)].add(i)
    merges = []
    import heapq
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if pair_count.get(p, 0) != -c or c == 0:
            continue  # stale entry
        a, b = p
        ab = a + b
        merges.append(p)
        if log and len(merges) % 250 == 0:
            log(f"merge {len(merges)}: {a!r}+{b!r} count {-c}")
        changed = set()
        for i in list(where[p]):
            w, f = words[i], freqs[i]
            # remove old pairs
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                changed.add((x, y))
            nw, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                changed.add((x, y))
        del pair_count[p]
        where.pop(p, None)
        for q in changed:
            if q in pair_count and pair_count[q] > 0:
                heapq.heappush(heap, (-pair_count[q], q))
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        self.tokens = [BYTE_ENC[b] for b in range(256)] + [a + b for a, b in self.merges]
        self.n_base = len(self.tokens)
        self.tokens += SPECIALS
        self.token_type = [1] * self.n_base + [3] * len(SPECIALS)
        self.id = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {m: i for i, m in enumerate(self.merges)}
        self.cache = {}

    @property
    def n_vocab(self):
        return len(self.tokens)

    def special(self, name):
        return self.id[name]

    def bpe(self, piece):
        if piece in self.cache:
            return self.cache[piece]
        w = list(to_symbols(piece))
        while len(w) > 1:
            best, bi = None, -1
            for i in range(len(w) - 1):
                r = self.rank.get((w[i], w[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            a, b = self.merges[best]
            nw, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(a + b)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            w = nw
        ids = [self.id[s] for s in w]
        self.cache[piece] = ids
        return ids

    def encode(self, text):
        out = []
        for piece in pretokenize(text):
            out += self.bpe(piece)
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            t = self.tokens[i]
            if i >= self.n_base:
                bs += t.encode()
            else:
                bs += bytes(BYTE_DEC[c] for c in t)
        return bs.decode("utf-8", errors="replace")

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"merges": [a + " " + b for a, b in self.merges], "specials": SPECIALS}, f)

    @staticmethod
    def load(path):
        with open(path) as f:
            d = json.load(f)
        return Tokenizer([m.split(" ") for m in d["merges"]])
