#!/usr/bin/python3
"""Training text for the small Clover model: the Python 3.11 standard library sources.

File rule (deterministic):
  every  /usr/lib/python3.11/**/*.py  (sorted by relative path), excluding any path with a
  component named `test`, `tests`, `idle_test`, `dist-packages`, `site-packages` or `__pycache__`.
Split: a file is held out when  crc32(relative_path) % 20 == 0  (about 5% of the files).
Text filter (so the Python tokenizer and the C++ qwen35 pre-tokenizer agree exactly):
  CRLF/CR -> LF; a line is kept only when every character is printable ASCII (0x20..0x7E) or TAB.
  Each file becomes  "# file: <relative path>\n" + kept lines + "\n"  and files are joined with
  the <|endoftext|> token between them.
"""
import os
import zlib

ROOT = "/usr/lib/python3.11"
EXCLUDE = {"test", "tests", "idle_test", "dist-packages", "site-packages", "__pycache__"}


def list_files(root=ROOT):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDE)
        for f in sorted(filenames):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                out.append(rel)
    return sorted(out)


def is_heldout(rel):
    return zlib.crc32(rel.encode()) % 20 == 0


def clean_text(raw):
    raw = raw.replace("\r\n", "\n").replace("\r", "\n")
    keep = []
    for line in raw.split("\n"):
        if all(c == "\t" or 0x20 <= ord(c) <= 0x7E for c in line):
            keep.append(line)
    return "\n".join(keep)


def load_split(root=ROOT):
    """Returns (train_docs, heldout_docs): lists of (relpath, text)."""
    train, held = [], []
    for rel in list_files(root):
        with open(os.path.join(root, rel), "r", encoding="utf-8", errors="replace") as fh:
            text = "# file: " + rel + "\n" + clean_text(fh.read()) + "\n"
        (held if is_heldout(rel) else train).append((rel, text))
    return train, held


if __name__ == "__main__":
    tr, he = load_split()
    print("train files", len(tr), "chars", sum(len(t) for _, t in tr))
    print("heldout files", len(he), "chars", sum(len(t) for _, t in he))
    print("heldout:", " ".join(r for r, _ in he))
