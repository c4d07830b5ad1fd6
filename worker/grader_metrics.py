"""The `text_similarity` grader's metrics, by hand: each a number in [0, 1], 1 for identical texts.

No metric needs data fetched at run time (the training process has no network), so none uses
NLTK: BLEU and GLEU follow NLTK's `sentence_bleu` (no smoothing) and `sentence_gleu` on
whitespace tokens; ROUGE follows Google's `rouge_score` (lower-cased alphanumeric tokens, no
stemming, the F-measure); METEOR is NLTK's formula with exact word matches only (see `meteor`).
"""

import math
import re
from collections import Counter

from rapidfuzz import fuzz

BLEU_ORDER = 4  # BLEU-4 with uniform weights, as NLTK's default
METEOR_ALPHA, METEOR_BETA, METEOR_GAMMA = 0.9, 3.0, 0.5  # NLTK's defaults


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _overlap(hypothesis: Counter, reference: Counter) -> int:
    """Matches clipped to the reference's count of each n-gram."""
    return sum(min(count, reference[gram]) for gram, count in hypothesis.items())


def fuzzy_match(text: str, reference: str) -> float:
    """rapidfuzz's normalised Indel similarity (`fuzz.ratio`), scaled to [0, 1]."""
    return fuzz.ratio(text, reference) / 100.0


def bleu(text: str, reference: str) -> float:
    """Sentence BLEU-4 against one reference: the geometric mean of clipped 1..4-gram precisions
    times the brevity penalty. Without smoothing, as NLTK: a text sharing no 4-gram scores 0."""
    hypothesis, ref = text.split(), reference.split()
    if not hypothesis:
        return 0.0
    logs = []
    for n in range(1, BLEU_ORDER + 1):
        grams = _ngrams(hypothesis, n)
        matches = _overlap(grams, _ngrams(ref, n))
        if matches == 0:
            return 0.0
        logs.append(math.log(matches / sum(grams.values())))
    length, ref_length = len(hypothesis), len(ref)
    brevity = 1.0 if length > ref_length else math.exp(1 - ref_length / length)
    return brevity * math.exp(sum(logs) / BLEU_ORDER)


def gleu(text: str, reference: str) -> float:
    """Google-BLEU: over all 1..4-grams, the lesser of precision and recall."""
    hypothesis, ref = text.split(), reference.split()
    ours = sum((_ngrams(hypothesis, n) for n in range(1, BLEU_ORDER + 1)), Counter())
    theirs = sum((_ngrams(ref, n) for n in range(1, BLEU_ORDER + 1)), Counter())
    if not ours or not theirs:
        return 0.0
    matches = _overlap(ours, theirs)
    return min(matches / sum(ours.values()), matches / sum(theirs.values()))


def meteor(text: str, reference: str) -> float:
    """METEOR with exact (lower-cased) word matches only: NLTK's also matches stems and WordNet
    synonyms, but WordNet is data NLTK downloads at run time and the training process has no
    network. So "ran" and "run" do not match here; everything else is NLTK's formula: the
    harmonic mean of precision and recall weighted by alpha, less a fragmentation penalty
    gamma * (chunks / matches) ** beta, with words aligned as NLTK's exact stage aligns them
    (from the end of both texts)."""
    hypothesis, ref = text.lower().split(), reference.lower().split()
    if not hypothesis or not ref:
        return 0.0
    free = list(range(len(ref)))
    aligned = []
    for i in reversed(range(len(hypothesis))):
        for j in reversed(free):
            if ref[j] == hypothesis[i]:
                aligned.append((i, j))
                free.remove(j)
                break
    if not aligned:
        return 0.0
    aligned.sort()
    chunks = 1 + sum(
        1 for (i, j), (k, m) in zip(aligned, aligned[1:], strict=False) if (k, m) != (i + 1, j + 1)
    )
    matches = len(aligned)
    precision, recall = matches / len(hypothesis), matches / len(ref)
    fmean = precision * recall / (METEOR_ALPHA * precision + (1 - METEOR_ALPHA) * recall)
    penalty = METEOR_GAMMA * (chunks / matches) ** METEOR_BETA
    return fmean * (1 - penalty)


def _rouge_tokens(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def _f_measure(matches: int, predicted: int, expected: int) -> float:
    if not matches:
        return 0.0
    precision, recall = matches / predicted, matches / expected
    return 2 * precision * recall / (precision + recall)


def rouge_n(text: str, reference: str, n: int) -> float:
    """ROUGE-N F-measure: n-gram overlap between the text and the reference."""
    ours, theirs = _ngrams(_rouge_tokens(text), n), _ngrams(_rouge_tokens(reference), n)
    return _f_measure(_overlap(ours, theirs), sum(ours.values()), sum(theirs.values()))


def rouge_l(text: str, reference: str) -> float:
    """ROUGE-L F-measure: the longest common subsequence of tokens."""
    ours, theirs = _rouge_tokens(text), _rouge_tokens(reference)
    previous = [0] * (len(theirs) + 1)
    for word in ours:
        current = [0]
        for j, other in enumerate(theirs):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    return _f_measure(previous[-1], len(ours), len(theirs))


METRICS = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "gleu": gleu,
    "meteor": meteor,
    **{f"rouge_{n}": (lambda t, r, n=n: rouge_n(t, r, n)) for n in range(1, 6)},
    "rouge_l": rouge_l,
}
