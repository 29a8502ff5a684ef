"""`python -m transformer_lib.check FILE.py`: the book's graders run on a reader's own file.

COMPONENTS maps each name a reader's file may define to its chapter's grader in `transformer_lib.exercises`;
Chapter 1 demonstrates the command on a file with a slip."""

__all__ = ['DESCRIPTION', 'COMPONENTS', 'ALIASES', 'run_checks', 'main']

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import sys
import textwrap
from pathlib import Path

DESCRIPTION = """Run the book's graders on the parts of the Transformer a reader wrote in a file of their own:

    python -m transformer_lib.check my_transformer.py

The file is imported; every top-level name listed in COMPONENTS (`--help` shows them) is handed to its chapter's
grader, and one line per component says `pass` or the mistake the grader names. Exit status: 0 when every
component found passes, 1 when one fails, 2 when the file cannot be imported or holds no known component."""


def _norm_from_class(cls, shift=True):
    """A reader's normalisation class, built as cls(d_model, eps=...), as the function its grader takes:
    layer_norm(x, gamma, beta, eps) (shift=True) or rms_norm(x, gamma, eps). The gain and bias are found by their
    usual names (weight/bias as in nn.LayerNorm, gamma/beta, a_2/b_2, g/b, scale/shift)."""
    import torch

    def norm(x, gamma, *rest):
        beta, eps = rest if shift else (None, rest[0])
        module = cls(x.shape[-1], eps=eps).to(x.dtype)
        params = dict(module.named_parameters())
        gain = next((n for n in ("weight", "gamma", "a_2", "g", "scale") if n in params), None)
        bias = next((n for n in ("bias", "beta", "b_2", "b", "shift") if n in params), None)
        if gain is None or (shift and bias is None):
            raise AssertionError(f"{cls.__name__}: cannot find its gain{' and bias' if shift else ''} among the "
                                 f"parameters {sorted(params)}; name them {'weight and bias' if shift else 'weight'}, "
                                 f"as nn.{'LayerNorm' if shift else 'RMSNorm'} does")
        with torch.no_grad():
            params[gain].copy_(gamma)
            if shift:
                params[bias].copy_(beta)
            return module(x)
    return norm


def _layer_norm_from_class(cls):
    return _norm_from_class(cls, shift=True)


def _rms_norm_from_class(cls):
    return _norm_from_class(cls, shift=False)


def _arity(fn, required: bool = False) -> int:
    """How many positional arguments fn takes (required: only those without defaults); -1 when it cannot be told."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return -1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and not (required and p.default is not p.empty)
               for p in params)


def _causal_mask_as_future_mask(fn):
    """causal_mask(T) as check_future_mask takes it, or the library's causal_mask(n_q, n_k) called with T, T."""
    return (lambda T: fn(T, T)) if _arity(fn, required=True) >= 2 else fn


def _length_penalty_as_score(fn):
    """length_penalty(length, alpha) -> lp, the library's (Chapter 8), as the score log_prob / lp that
    check_length_penalty grades; a three-argument length_penalty(log_prob, length, alpha) is graded as it is."""
    return (lambda log_prob, length, alpha: log_prob / fn(length, alpha)) if _arity(fn) == 2 else fn


def _token_mean_loss_with_n_local(fn):
    """The library's token_mean_loss(loss_sum, n_global, world_size) as check_token_mean_loss calls it,
    fn(loss_sum, n_local, n_global, context), context being the rank's DistributedContext; a four-argument
    function is graded as it is."""
    if _arity(fn) == 3:
        return lambda loss_sum, n_local, n_global, context: fn(loss_sum, n_global, context.world_size)
    return fn


# name in the reader's file: (the other names it needs, "exercises module:grader", where it is taught, adapter)
COMPONENTS = {
    "scaled_dot_product_attention": ((), "attention:check_attention", "chapter 1, section 1.3", None),
    "attention_backward": ((), "attention:check_attention_backward", "chapter 1, exercise 1", None),
    "additive_scores": ((), "attention:check_additive_scores", "chapter 1, exercise 3", None),
    "split_heads": (("merge_heads",), "multi_head:check_split_merge", "chapter 2, section 2.3", None),
    "load_gpt2_attention": ((), "multi_head:check_gpt2_attention", "chapter 2, exercise 1", None),
    "heads_loop": ((), "multi_head:check_heads_loop", "chapter 2, exercise 2", None),
    "MultiHeadAttention": ((), "multi_head:check_multi_head_attention", "chapter 2, the module", None),
    "sinusoidal_encoding": ((), "positional:check_sinusoidal_encoding", "chapter 3, section 3.2", None),
    "pe_by_rotation": (("first_drift",), "positional:check_pe_recurrence", "chapter 3, exercise 1", None),
    "smallest_base": ((), "positional:check_smallest_base", "chapter 3, exercise 2", None),
    "LearnedPositionalEncoding": ((), "positional:check_learned_positions", "chapter 3, the learned table", None),
    "stretch_table": ((), "positional:check_stretch_table", "chapter 3, exercise 3", None),
    "apply_rotary": ((), "positional:check_rotary", "chapter 3, exercise 4", None),
    "rotate": ((), "positional:check_rotary", "chapter 3, exercise 4", None),
    "feed_forward": ((), "feed_forward:check_feed_forward", "chapter 4, section 4.2", None),
    "ffn_backward": ((), "feed_forward:check_ffn_backward", "chapter 4, exercise 1", None),
    "SwiGLUFeedForward": ((), "feed_forward:check_swiglu", "chapter 4, section 4.2 (gated)", None),
    "swiglu_width": ((), "feed_forward:check_swiglu_width", "chapter 4, exercise 2", None),
    "layer_norm": ((), "residual:check_layer_norm", "chapter 5, section 5.2", None),
    "LayerNorm": ((), "residual:check_layer_norm", "chapter 5, section 5.2", _layer_norm_from_class),
    "layer_norm_backward": ((), "residual:check_layer_norm_backward", "chapter 5, exercise 1", None),
    "fold_layer_norm": ((), "residual:check_fold_layer_norm", "chapter 5, exercise 2", None),
    "keeps_identity": ((), "residual:check_identity_probe", "chapter 5, exercise 4", None),
    "rms_norm": ((), "residual:check_rms_norm", "chapter 12, section 12.1", None),
    "RMSNorm": ((), "residual:check_rms_norm", "chapter 12, section 12.1", _rms_norm_from_class),
    "encoder_layer": ((), "encoder:check_encoder_layer", "chapter 6, the layer", None),
    "packing_mask": (("packed_positions",), "encoder:check_packing", "chapter 6, exercise 1", None),
    "EncoderLayer": ((), "encoder:check_encoder_layer_module", "chapter 6, the layer", None),
    "left_pad_positions": ((), "encoder:check_left_pad_positions", "chapter 6, exercise 2", None),
    "reach": ((), "encoder:check_reach", "chapter 6, exercise 3", None),
    "tgt_mask": ((), "decoder:check_tgt_mask", "chapter 7, the target mask", None),
    "prefix_lm_mask": ((), "decoder:check_prefix_lm_mask", "chapter 7, exercise 1", None),
    "parameter_count": ((), "decoder:check_parameter_count", "chapter 7, exercise 2", None),
    "two_way_tied": ((), "decoder:check_two_way_tying", "chapter 7, exercise 3", None),
    "causal_mask": ((), "decoder:check_future_mask", "chapter 7, exercise 4", _causal_mask_as_future_mask),
    "first_leak": ((), "decoder:check_first_leak", "chapter 7, exercise 4", None),
    "label_smoothing_loss": ((), "training:check_label_smoothing", "chapter 8, label smoothing", None),
    "others_smoothing": ((), "training:check_others_smoothing", "chapter 8, exercise 1", None),
    "length_penalty": ((), "training:check_length_penalty", "chapter 8, beam search", _length_penalty_as_score),
    "tie_alpha": ((), "training:check_tie_alpha", "chapter 8, exercise 2", None),
    "noam_lr": ((), "training:check_noam", "chapter 8, the paper's schedule", None),
    "cosine_lr": ((), "training:check_cosine_lr", "chapter 8, exercise 3", None),
    "encoder_layer_flops": ((), "complexity:check_encoder_layer_flops", "chapter 9, section 9.3", None),
    "decoder_layer_flops": ((), "complexity:check_decoder_layer_flops", "chapter 9, exercise 1", None),
    "pool": ((), "classifier:check_pooling", "chapter 10, section 10.3", None),
    "AttentionPool": ((), "classifier:check_attention_pooling", "chapter 10, exercise 1", None),
    "context_free_loss": ((), "classifier:check_context_free_loss", "chapter 10, exercise 4", None),
    "top_p": ((), "sampling:check_top_p", "chapter 11, sampling", None),
    "min_p": ((), "sampling:check_min_p", "chapter 11, exercise 1", None),
    "bits_per_byte": ((), "sampling:check_bits_per_byte", "chapter 11, bits per byte", None),
    "byte_bigram_bpb": ((), "sampling:check_byte_bigram_bpb", "chapter 11, exercise 2", None),
    "temperature_for": ((), "sampling:check_temperature_for", "chapter 11, exercise 3", None),
    "kv_cache_bytes": ((), "sampling:check_kv_cache_bytes", "chapter 11, section 11.7", None),
    "lm_loss": ((), "sampling:check_lm_loss", "chapter 11, exercise 4", None),
    "relative_position_bucket": ((), "t5:check_buckets", "chapter 12, section 12.1", None),
    "alibi_bias": ((), "t5:check_alibi", "chapter 12, exercise 1", None),
    "alibi_reach": ((), "t5:check_alibi_reach", "chapter 12, exercise 1", None),
    "GatedFeedForward": ((), "t5:check_gated_ffn", "chapter 12, exercise 2", None),
    "overlapping_patchify": ((), "t5:check_overlapping_patches", "chapter 12, exercise 4", None),
    "who_reads": ((), "distributed:check_who_reads", "chapter 13, exercise 1", None),
    "rank_indices": ((), "distributed:check_rank_indices", "chapter 13, section 13.2", None),
    "token_mean_loss": ((), "distributed:check_token_mean_loss", "chapter 13, exercise 2",
                        _token_mean_loss_with_n_local),
    "rng_state": (("set_rng_state",), "distributed:check_rng_restore", "chapter 13, section 13.4", None),
    "resume": ((), "distributed:check_resume", "chapter 13, exercise 4", None),
    "rope": ((), "llama:check_rope", "chapter 14, exercise 1", None),
    "gqa": ((), "llama:check_gqa_attention", "chapter 14, exercise 2", None),
    "online_merge": ((), "llama:check_online_merge", "chapter 14, exercise 3", None),
    "stream_decode": ((), "assistant:check_stream_decode", "chapter 16, exercise 1", None),
    "bpe_merges": ((), "assistant:check_bpe_merges", "chapter 16, exercise 2", None),
    "last_turn_labels": ((), "assistant:check_last_turn_labels", "chapter 16, exercise 3", None),
    "dpo_loss": ((), "assistant:check_dpo_loss", "chapter 16, exercise 4", None),
    "last_hidden": ((), "assistant:check_last_hidden", "chapter 16, exercise 5", None),
}

# The exercises' names for the same components: my_<name> is read as <name>, and these as well.
ALIASES = {"my_attention": "scaled_dot_product_attention", "my_encoding": "sinusoidal_encoding",
           "my_label_smoothing": "label_smoothing_loss", "my_buckets": "relative_position_bucket",
           "save_generators": "rng_state", "restore_generators": "set_rng_state",
           "fixed_future_mask": "causal_mask", "my_merge": "online_merge"}


def _canonical(name: str):
    """The COMPONENTS (or needed) name that a top-level name of the reader's file stands for, or None."""
    known = set(COMPONENTS) | {o for others, *_ in COMPONENTS.values() for o in others}
    if name in ALIASES:
        return ALIASES[name]
    if name.startswith("my_") and name[3:] in known:
        return name[3:]
    return name if name in known else None


def _usage() -> str:
    labels = {name: " + ".join((name, *others)) for name, (others, _, _, _) in COMPONENTS.items()}
    width = max(map(len, labels.values()))
    grader_width = max(len(grader.split(":")[1]) for _, grader, _, _ in COMPONENTS.values())
    rows = []
    for name, (_, grader, where, _) in COMPONENTS.items():
        rows.append(f"  {labels[name]:<{width}}  {grader.split(':')[1]:<{grader_width}}  {where}")
    aliases = ", ".join(f"{a} = {c}" for a, c in ALIASES.items())
    note = textwrap.fill(f"my_<name> (the exercises' names) is read as <name>; also {aliases}.", 116,
                         initial_indent="  ", subsequent_indent="  ")
    return "components recognised by name (with the grader that checks them):\n" + "\n".join(rows) + "\n\n" + note


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_reader_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))                 # the reader's file may import its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def run_checks(namespace: dict) -> list[tuple[str, bool, str]]:
    """Grade every known component in `namespace` (a module's `vars`): (name, passed, one-line verdict) each, named
    as the reader's file names it (my_attention is graded as scaled_dot_product_attention)."""
    found = {}                                          # canonical name -> the reader's names for it, in file order
    for name, value in namespace.items():
        canonical = _canonical(name)
        library = str(getattr(value, "__module__", "")).split(".")[0] in ("torch", "transformer_lib")
        if canonical is not None and not library:        # imported from torch or the book: not the reader's
            found.setdefault(canonical, []).append(name)
    results = []
    for canonical, (others, grader, where, adapter) in COMPONENTS.items():
        for name in found.get(canonical, ()):
            prefix = "my_" if name.startswith("my_") and name != canonical else ""
            # the names it needs, as the reader spells them: my_merge_heads next to my_split_heads, else merge_heads
            partners = [next((n for n in (prefix + o, *found.get(o, ())) if n in namespace), None) for o in others]
            missing = [o for o, p in zip(others, partners, strict=True) if p is None]
            if missing:
                results.append((name, False, f"needs {', '.join(missing)} too ({where} checks them together)"))
                continue
            module_name, fn_name = grader.split(":")
            check = getattr(importlib.import_module(f"transformer_lib.exercises.{module_name}"), fn_name)
            answer = namespace[name] if adapter is None else adapter(namespace[name])
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    check(answer, *(namespace[p] for p in partners))
                results.append((name, True, f"pass ({fn_name}, {where})"))
            except AssertionError as e:
                results.append((name, False, f"{e} ({fn_name}, {where})"))
            except Exception as e:                       # the reader's code crashed inside the grader
                results.append((name, False, f"raised {type(e).__name__}: {e} ({fn_name}, {where})"))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_lib.check", description=DESCRIPTION.split("\n\n")[0],
                                     epilog=_usage(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="your Python file")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"file {str(args.file)!r} does not exist")
    try:
        namespace = vars(_load(args.file.resolve()))
    except Exception as e:
        print(f"{args.file}: importing it raised {type(e).__name__}: {e}")
        return 2
    results = run_checks(namespace)
    if not results:
        print(f"{args.file}: no component this command knows (see --help for the names it looks for)")
        return 2
    width = max(len(name) for name, _, _ in results)
    for name, passed, verdict in results:
        print(f"{name:<{width}}  {'ok  ' if passed else 'FAIL'}  {verdict}")
    failed = sum(not passed for _, passed, _ in results)
    print(f"{len(results) - failed} of {len(results)} components pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
