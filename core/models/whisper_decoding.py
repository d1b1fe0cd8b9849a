"""Decoding one 30 s window, after openai-whisper's decoding.py (MIT): greedy or
sampling (GreedyDecoder), beam search (BeamSearchDecoder with patience), logit
filters (SuppressBlank, SuppressTokens, ApplyTimestampRules), the maximum
likelihood ranker, language detection and the no-speech probability.
"""
import math
import random
import zlib

from ..errors import Error
from .decode_threads import one_thread
from .whisper_logits import logit_rows

CHUNK_LENGTH = 30  # seconds a window covers
# The most beams (beam_size) or samples (best_of) one window decodes at once. Each keeps
# its own self-attention cache (large-v3: about 150 MB each at full length) and
# multiplies every step's work; openai-whisper's and faster-whisper's default is 5, and
# quality stops improving well before 16. Unbounded, --beam-size 100000 asked numpy
# for 64 GiB, and 3000 grew to 16 GB.
MAX_BEAM_SIZE = 16


def check_search_width(beam_size=None, best_of=None, patience=None):
    """Raise an Error unless beam_size / best_of are whole numbers 1..MAX_BEAM_SIZE (or None)
    and patience a finite number > 0 (or None)."""
    for name, value in (("beam_size", beam_size), ("best_of", best_of)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BEAM_SIZE:
            raise Error(f"whisper: {name} must be a whole number from 1 to {MAX_BEAM_SIZE}, got {value!r} "
                        f"(each one decodes its own copy of the text; 5 is the usual choice)")
    if patience is not None and not (isinstance(patience, (int, float)) and math.isfinite(patience)
                                     and patience > 0):
        raise Error(f"whisper: patience must be a finite number > 0, got {patience!r}")


class DecodingOptions:
    """What `decode` does. temperature 0 is greedy (or beam search with beam_size);
    best_of samples that many at temperature > 0 and keeps the most likely."""

    def __init__(self, task="transcribe", language=None, temperature=0.0, sample_len=None, best_of=None,
                 beam_size=None, patience=None, length_penalty=None, prompt=None, prefix=None,
                 suppress_tokens="-1", suppress_blank=True, without_timestamps=False,
                 max_initial_timestamp=1.0, seed=None):
        if task not in ("transcribe", "translate"):
            raise Error(f"whisper: task must be 'transcribe' or 'translate', got {task!r}")
        if beam_size is not None and best_of is not None:
            raise Error("whisper: beam_size and best_of can't be given together")
        if temperature == 0 and best_of is not None:
            raise Error("whisper: best_of needs temperature > 0 (with temperature 0 use beam_size)")
        if patience is not None and beam_size is None:
            raise Error("whisper: patience requires beam_size")
        if length_penalty is not None and not 0 <= length_penalty <= 1:
            raise Error("whisper: length_penalty must be between 0 and 1")
        check_search_width(beam_size, best_of, patience)
        self.task, self.language, self.temperature = task, language, temperature
        self.sample_len, self.best_of, self.beam_size, self.patience = sample_len, best_of, beam_size, patience
        self.length_penalty, self.prompt, self.prefix = length_penalty, prompt, prefix
        self.suppress_tokens, self.suppress_blank = suppress_tokens, suppress_blank
        self.without_timestamps, self.max_initial_timestamp, self.seed = without_timestamps, max_initial_timestamp, seed


class DecodingResult:
    def __init__(self, **fields):
        self.tokens, self.text, self.language = fields["tokens"], fields["text"], fields["language"]
        self.avg_logprob, self.sum_logprob = fields["avg_logprob"], fields["sum_logprob"]
        self.no_speech_prob, self.temperature = fields["no_speech_prob"], fields["temperature"]
        self.compression_ratio = compression_ratio(self.text)

    def __repr__(self):
        return (f"DecodingResult(text={self.text!r}, avg_logprob={self.avg_logprob:.3f}, "
                f"no_speech_prob={self.no_speech_prob:.3f}, temperature={self.temperature})")


def compression_ratio(text):
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


# ---- logit filters ----------------------------------------------------------------------------
class SuppressBlank:
    """No blank (" ") or end-of-text as the very first sampled token."""

    def __init__(self, tokens, sample_begin):
        self.ids = tokens.tokenizer.encode(" ", add_special_tokens=False) + [tokens.eot]
        self.sample_begin = sample_begin

    def apply(self, rows, seqs):
        if len(seqs[0]) == self.sample_begin:
            rows.suppress_ids(self.ids)


class SuppressTokens:
    def __init__(self, ids):
        self.ids = list(ids)

    def apply(self, rows, seqs):
        rows.suppress_ids(self.ids)


class ApplyTimestampRules:
    """Timestamps come in pairs (except right before end-of-text), never decrease,
    the first token is a timestamp <= max_initial_timestamp, and a timestamp is forced
    when all timestamps together are likelier than any single text token."""

    def __init__(self, tokens, sample_begin, max_initial_timestamp_index):
        self.t = tokens
        self.sample_begin = sample_begin
        self.max_initial_index = max_initial_timestamp_index

    def apply(self, rows, seqs):
        tb, eot = self.t.timestamp_begin, self.t.eot
        rows.suppress(None, self.t.no_timestamps, self.t.no_timestamps + 1)
        for k, seq in enumerate(seqs):
            sampled = seq[self.sample_begin:]
            last_ts = len(sampled) >= 1 and sampled[-1] >= tb
            penultimate_ts = len(sampled) < 2 or sampled[-2] >= tb
            if last_ts:
                if penultimate_ts:  # a closed pair: text must follow
                    rows.suppress(k, tb)
                else:  # an open pair: close it (or end)
                    rows.suppress(k, 0, eot)
            stamps = [s for s in sampled if s >= tb]
            if stamps:
                # no going back in time, and every segment has a nonzero length
                last = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
                rows.suppress(k, tb, last)
        if len(seqs[0]) == self.sample_begin:
            rows.suppress(None, 0, tb)
            if self.max_initial_index is not None:
                rows.suppress(None, tb + self.max_initial_index + 1)
        for k in range(rows.n):
            # logsumexp(timestamp logprobs) > max(text logprobs); the normaliser cancels
            if rows.logsumexp(k, tb) > rows.max(k, 0, tb):
                rows.suppress(k, 0, tb)


# ---- token decoders ----------------------------------------------------------------------------
class GreedyDecoder:
    def __init__(self, temperature, eot, rng):
        self.temperature, self.eot, self.rng = temperature, eot, rng

    def update(self, seqs, rows, sum_logprobs, state):
        out = []
        for k, seq in enumerate(seqs):
            if seq[-1] == self.eot:
                out.append(seq + [self.eot])
                continue
            nxt = rows.argmax(k) if self.temperature == 0 else rows.sample(k, self.temperature, self.rng)
            sum_logprobs[k] += rows.value(k, nxt) - rows.logsumexp(k)
            out.append(seq + [nxt])
        return out, all(s[-1] == self.eot for s in out)

    def finalize(self, seqs, sum_logprobs):
        return [s + [self.eot] for s in seqs], list(sum_logprobs)


class BeamSearchDecoder:
    """Beam search over one audio; a candidate list of beam_size * patience finished sequences."""

    def __init__(self, beam_size, eot, patience=None):
        self.beam_size, self.eot = beam_size, eot
        self.max_candidates = round(beam_size * (patience or 1.0))
        if self.max_candidates < 1:
            raise Error(f"whisper: beam_size {beam_size} with patience {patience} keeps no candidates")
        self.finished = {}

    def update(self, seqs, rows, sum_logprobs, state):
        scores, sources = {}, {}
        for k, seq in enumerate(seqs):
            lse = rows.logsumexp(k)
            for logprob, token in rows.topk(k, self.beam_size + 1, lse):
                candidate = tuple(seq) + (token,)
                scores[candidate] = sum_logprobs[k] + logprob
                sources[candidate] = k
        kept, kept_sources, newly_finished = [], [], {}
        for candidate in sorted(scores, key=scores.get, reverse=True):
            if candidate[-1] == self.eot:
                newly_finished[candidate] = scores[candidate]
            else:
                sum_logprobs[len(kept)] = scores[candidate]
                kept.append(list(candidate))
                kept_sources.append(sources[candidate])
                if len(kept) == self.beam_size:
                    break
        state.reorder(kept_sources)
        for candidate in sorted(newly_finished, key=newly_finished.get, reverse=True):
            if len(self.finished) >= self.max_candidates:
                break
            self.finished[candidate] = newly_finished[candidate]
        return kept, len(self.finished) >= self.max_candidates

    def finalize(self, seqs, sum_logprobs):
        finished = dict(self.finished)
        if len(finished) < self.beam_size:  # not enough ended: take the best unfinished ones
            for k in sorted(range(len(seqs)), key=lambda k: sum_logprobs[k], reverse=True):
                finished[tuple(seqs[k]) + (self.eot,)] = sum_logprobs[k]
                if len(finished) >= self.beam_size:
                    break
        return [list(s) for s in finished], list(finished.values())


def rank(candidates, sum_logprobs, length_penalty):
    """Index of the best candidate: log probability over length (or the Google NMT penalty)."""
    def score(tokens, logprob):
        n = len(tokens)
        penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
        return logprob / penalty if penalty else logprob
    scores = [score(t, lp) for t, lp in zip(candidates, sum_logprobs)]
    return max(range(len(scores)), key=scores.__getitem__)


# ---- the decode --------------------------------------------------------------------------------
def suppress_token_ids(model, option):
    """The ids to suppress: "-1" means the checkpoint's list (or the non-speech symbols),
    always plus the task/start tokens and <|nospeech|>."""
    tok = model.tokens
    if isinstance(option, str):
        option = [int(t) for t in option.split(",") if t.strip()]
    ids = list(option or [])
    if -1 in ids:
        ids = [t for t in ids if t >= 0]
        ids.extend(model.config.suppress_tokens if model.config.suppress_tokens is not None
                   else tok.non_speech_tokens())
    ids.extend(t for t in (tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech)
               if t is not None)
    return sorted({t for t in ids if 0 <= t < model.config.vocab_size})


def detect_language_from_features(model, features):
    """(best language code, {code: probability}) from the logits after <|startoftranscript|>."""
    tok = model.tokens
    if not model.is_multilingual or not tok.languages:
        raise Error(f"{model.name}: an English-only model cannot detect the language")
    logits = model.decode_step([[tok.sot]], model.start(features)).reshape(1, -1)
    rows = logit_rows(logits)
    # a softmax over the language tokens only (openai-whisper masks all the others)
    values = {code: rows.value(0, i) for code, i in tok.languages.items()}
    top = max(values.values())
    lse = top + math.log(sum(math.exp(v - top) for v in values.values()))
    probs = {code: math.exp(v - lse) for code, v in values.items()}
    return max(probs, key=probs.get), probs


def _run_steps(model, state, decoder, filters, initial, sot_index, n_group, sample_len):
    """Prefill `initial` once (batch 1), copy its cache rows for the group, then decode token
    by token -> (sequences, their sum log-probabilities, the no-speech probability)."""
    tok, n_ctx = model.tokens, model.config.max_target_positions
    sample_begin = len(initial)
    logits = model.decode_step([initial], state, positions=[sot_index, sample_begin - 1])
    first = logit_rows(logits.narrow(1, 0, 1).reshape(1, -1))
    no_speech_prob = (math.exp(first.value(0, tok.no_speech) - first.logsumexp(0)) if tok.no_speech is not None
                      else math.nan)
    last = logits.narrow(1, 1, 1).reshape(1, -1)
    if n_group > 1:
        state.reorder([0] * n_group)
        last = last.expand(n_group, last.shape[1])
    seqs = [list(initial) for _ in range(n_group)]
    sum_logprobs = [0.0] * n_group
    for step in range(sample_len):
        if step:
            last = model.decode_step([[s[-1]] for s in seqs], state).reshape(len(seqs), -1)
        rows = logit_rows(last)
        for f in filters:
            f.apply(rows, seqs)
        seqs, completed = decoder.update(seqs, rows, sum_logprobs, state)
        if completed or len(seqs[0]) > n_ctx:
            break
    return seqs, sum_logprobs, no_speech_prob


def decode(model, features, options):
    """Decode one window's audio features (1, frames, d) -> DecodingResult."""
    tok, cfg = model.tokens, model.config
    n_ctx = cfg.max_target_positions
    sample_len = options.sample_len or n_ctx // 2
    language = options.language
    if model.is_multilingual and language is None:
        language, _ = detect_language_from_features(model, features)
    elif not model.is_multilingual:
        language = "en"

    initial = tok.sot_sequence(language, options.task)
    if options.without_timestamps:
        initial.append(tok.no_timestamps)
    if options.prefix:
        prefix = options.prefix
        prefix = (tok.tokenizer.encode(" " + prefix.strip(), add_special_tokens=False) if isinstance(prefix, str)
                  else list(prefix))
        initial += prefix[-(n_ctx // 2 - sample_len):] if n_ctx // 2 > sample_len else []
    if options.prompt:
        prompt = options.prompt
        prompt = (tok.tokenizer.encode(" " + prompt.strip(), add_special_tokens=False) if isinstance(prompt, str)
                  else list(prompt))
        initial = [tok.sot_prev] + prompt[-(n_ctx // 2 - 1):] + initial
    sample_begin = len(initial)
    sot_index = initial.index(tok.sot)

    filters = []
    if options.suppress_blank:
        filters.append(SuppressBlank(tok, sample_begin))
    if options.suppress_tokens:
        filters.append(SuppressTokens(suppress_token_ids(model, options.suppress_tokens)))
    if not options.without_timestamps:
        precision = CHUNK_LENGTH / cfg.max_source_positions
        max_initial = round(options.max_initial_timestamp / precision) if options.max_initial_timestamp else None
        filters.append(ApplyTimestampRules(tok, sample_begin, max_initial))

    rng = random.Random(options.seed)
    if options.beam_size is not None:
        decoder = BeamSearchDecoder(options.beam_size, tok.eot, options.patience)
        n_group = options.beam_size
    else:
        decoder = GreedyDecoder(options.temperature, tok.eot, rng)
        n_group = options.best_of or 1

    state = model.start(features)
    # the steps multiply one row (a few per beam) at a time: one thread (decode_threads.py)
    with one_thread():
        seqs, sum_logprobs, no_speech_prob = _run_steps(model, state, decoder, filters, initial, sot_index,
                                                         n_group, sample_len)
    candidates, logprobs = decoder.finalize(seqs, sum_logprobs[:len(seqs)])
    candidates = [c[sample_begin:c.index(tok.eot, sample_begin)] for c in candidates]
    best = rank(candidates, logprobs, options.length_penalty)
    tokens = candidates[best]
    return DecodingResult(tokens=tokens, text=tok.decode_text(tokens).strip(), language=language,
                          sum_logprob=logprobs[best], avg_logprob=logprobs[best] / (len(tokens) + 1),
                          no_speech_prob=no_speech_prob, temperature=options.temperature)
