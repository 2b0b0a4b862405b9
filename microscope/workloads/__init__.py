"""The embedded default workload: a small LLaMA-style model trained on the running Python's own text.

Nothing is downloaded: the corpus is the interpreter's standard library (code; train and in-domain
validation, split by file) and its bundled documentation topics (English prose; out-of-domain), read
through a byte-level tokenizer. Modules, one job each:

``tokenizer``   bytes <-> ids (+ BOS/EOS/PAD)
``corpus``      ``CorpusSpec`` -> ``Corpus`` (token splits, file lists, SHA-256)
``batching``    seeded training windows, fixed evaluation windows
``synthetic``   associative recall, a task with a known answer at any context length
``attention``   the ``attn_fn`` swap point (eager default) and RoPE
``kv_cache``    the replaceable KV cache
``model``       ``ModelConfig``, ``Transformer``, ``build_model`` (swap points listed there)
``linear_swap`` ``ConvertedLinear``: a Linear replacement storing its weight its own way (quantized)
``generate``    greedy generation and teacher-forced scoring through the cache
``train``       ``TrainRecipe``, ``train`` -> ``TrainResult`` (per-step stability record)
``stability``   layer groups and the loss-spike rule
``evaluate``    loss / perplexity / accuracy / per-token losses; 1x, 2x, 4x context and out-of-domain
``throughput``  prefill and decode tokens/s
``memory``      peak memory of a train step and of inference
``checks``      probes that catch broken patches (future-token leaks)
``profiles``    ``tiny`` (CPU) and ``gpu`` sizes
"""

from microscope.workloads.attention import (
    AttnFn,
    EagerAttention,
    RotaryEmbedding,
    apply_rotary,
    eager_attention,
)
from microscope.workloads.batching import WindowSampler, eval_windows
from microscope.workloads.checks import PROBE_BATCH, future_leak, repeat_noise
from microscope.workloads.corpus import Corpus, CorpusSpec, load_corpus
from microscope.workloads.evaluate import EvalResult, evaluate, evaluate_suite
from microscope.workloads.generate import CachedScore, generate_greedy, score_through_cache
from microscope.workloads.kv_cache import KVCache
from microscope.workloads.linear_swap import ConvertedLinear
from microscope.workloads.memory import (
    PeakProbe,
    cuda_peak_memory,
    peak_memory_inference,
    peak_memory_train_step,
)
from microscope.workloads.model import (
    MLP,
    Attention,
    Block,
    ModelConfig,
    NormGelu,
    RMSNorm,
    Transformer,
    build_model,
)
from microscope.workloads.profiles import PROFILES, Profile, get_profile
from microscope.workloads.stability import layer_groups, loss_spikes
from microscope.workloads.synthetic import AssociativeRecall, RecallBatch, recall_accuracy
from microscope.workloads.throughput import Throughput, decode_throughput, prefill_throughput
from microscope.workloads.tokenizer import BOS, EOS, PAD, VOCAB_SIZE, ByteTokenizer
from microscope.workloads.train import StepMetrics, Trainer, TrainRecipe, TrainResult, lm_loss, lr_at, train

__all__ = [
    "BOS",
    "EOS",
    "MLP",
    "PAD",
    "PROBE_BATCH",
    "PROFILES",
    "VOCAB_SIZE",
    "AssociativeRecall",
    "Attention",
    "AttnFn",
    "Block",
    "ByteTokenizer",
    "CachedScore",
    "ConvertedLinear",
    "Corpus",
    "CorpusSpec",
    "EagerAttention",
    "EvalResult",
    "KVCache",
    "ModelConfig",
    "NormGelu",
    "PeakProbe",
    "Profile",
    "RMSNorm",
    "RecallBatch",
    "RotaryEmbedding",
    "StepMetrics",
    "Throughput",
    "TrainRecipe",
    "TrainResult",
    "Trainer",
    "Transformer",
    "WindowSampler",
    "apply_rotary",
    "build_model",
    "cuda_peak_memory",
    "decode_throughput",
    "eager_attention",
    "eval_windows",
    "evaluate",
    "evaluate_suite",
    "future_leak",
    "generate_greedy",
    "get_profile",
    "layer_groups",
    "lm_loss",
    "load_corpus",
    "loss_spikes",
    "lr_at",
    "peak_memory_inference",
    "peak_memory_train_step",
    "prefill_throughput",
    "recall_accuracy",
    "repeat_noise",
    "score_through_cache",
    "train",
]
