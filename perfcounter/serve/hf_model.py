"""A transformers causal LM as serve takes it: `HfArgs`, one rank's config and what its memory
plan reads, built on transformers' own config class and modeling code (no second copy of
any architecture).

    args = HfArgs.of(config, "qwen3-30b-a3b")          # a PretrainedConfig (text config)
    args = args.sharded(tensor_parallel_size=4)        # one rank of TP 4
    args.rank_config()                                 # the config one rank's model is built from
    args.weight_params(), args.kv_elements_per_token()

serve prices perfcounter's own model for the architectures it holds exactly (llama, mistral,
qwen2, mixtral: resolve.py keeps them there, results unchanged) and every other causal LM
transformers ships as an HfArgs: its step table counts transformers' model (ragged_hf.py,
steps_hf.py), its memory plan reads the parameters of that model and the KV cache as
vLLM stores it (models/kv_layout.py, the "engine" layout).

Tensor parallelism (vLLM's, Megatron's): one rank's model is transformers' model built from
the config with the sharded sizes divided: attention heads (num_attention_heads / TP; KV heads
/ TP where there are at least TP of them, else one a rank, replicated, as vLLM's
QKVParallelLinear does; MLA's q_b_proj, kv_b_proj and o_proj follow the heads, its q_a_proj and
kv_a_proj_with_mqa stay whole: vllm/model_executor/models/deepseek_v2.py builds them as
ReplicatedLinear), every feed-forward width (intermediate_size, moe_intermediate_size,
intermediate_size_mlp, shared_expert_intermediate_size: column-parallel up, row-parallel
down, each expert split the same way without expert parallelism) and the vocabulary
(ceil(V' / TP) rows of the embedding and the LM head, V' padded to a multiple of 64:
VocabParallelEmbedding). The rank's collectives are vLLM's: an all-reduce of the attention's
output and of the feed-forward's (a mixture of experts reduces once, its shared experts
summed in: FusedMoE's reduce_results), the vocabulary-parallel embedding's all-reduce and the
LM head's all-gather of the logits. Which rule divided a module is checked against the
config's own tensor-parallel plan (`base_model_tp_plan`) where it has one (`tp_rules`):
"colwise" modules must hold out_features / TP, "rowwise" ones in_features / TP.

Expert parallelism (--enable_expert_parallel, vLLM's: the routed experts over TP x DP ranks):
- over data-parallel ranks (TP 1, DP = EP: vLLM's attention data parallelism, the way the
  ML.ENERGY Leaderboard ran its MoE rows, tensor_parallel 1 x expert_parallel N): each rank
  runs attention on its own requests with whole weights and holds E / EP whole experts
  (`expert_parallel_size`), routed to by each token's top-k among them (the router over the
  rank's experts: NB its E / EP columns, not E); a balanced routing brings a rank as many
  rows as its tokens send (T k), and each token goes to min(k, EP) ranks and back: an
  all-to-all each way (ragged_hf._expert_parallel, DeepEP's dispatch and combine);
- over one replica's TP ranks (DP 1): priced as the experts split by TP, which computes the
  same rows x widths (T k / EP rows of whole experts, or T k rows of 1 / TP of each) and
  reads the same expert bytes a rank in expectation, combined by the same all-reduce; NB the
  GEMMs' shapes differ, so a prediction's per-row efficiency is TP's;
- both (TP > 1 and DP > 1, vLLM's EP over TP x DP ranks): a rank holds E / DP experts,
  each split by TP (`expert_parallel_size` DP), routed to by its tokens' top-k among them:
  T k rows of 1 / TP of an expert, the same rows x widths and expert bytes a rank as E /
  (TP DP) whole experts over T k / TP rows in expectation; each token dispatched and
  combined over the TP x DP ranks (all-to-all), and the TP all-reduce of the feed-forward's
  output kept beside it (NB an upper bound: vLLM's combine returns the experts' sum).

Pipeline parallelism (--pipeline_parallel_size, vLLM's): the layers split into stages as
vLLM splits them (pipeline_stages); a rank is priced on the stage whose layers hold the most
parameters (`layers`: its [start, end)), with the embedding and the LM head, as
perfcounter's model is on its stage of the most layers (serve/replicas.py prices the steps
through the stages and the hops between them).
"""
from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass

import torch

from perfcounter.generation.config_only import fake_hf_model
from perfcounter.generation.derive_layers import arranged, layer_kinds, with_layers
from perfcounter.models import kv_layout
from perfcounter.models.layer_paths import layer_of
from perfcounter.serve.hf_stored import StoredFormat

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
# the feed-forward widths a rank of tensor parallelism holds a TP-th of, by config field
WIDTHS = ("intermediate_size", "moe_intermediate_size", "intermediate_size_mlp",
          "shared_expert_intermediate_size")
EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts")
TOP_K = ("num_experts_per_tok", "moe_topk", "top_k")
# our model's architectures: resolve.py keeps them on perfcounter's model
OURS = ("llama", "mistral", "qwen2", "mixtral")


def _first(config, names, default=0):
    return next((getattr(config, n) for n in names if getattr(config, n, None)), default)


@dataclass(frozen=True)
class HfArgs:
    """A transformers causal LM (its text config as JSON: hashable, and a key of the step
    tables' cache) and one rank's tensor-parallel size."""

    name: str
    model_type: str
    config_json: str
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1  # the ranks its routed experts spread over (1: TP splits them)
    layers: tuple | None = None  # a pipeline stage's layers [start, end); None: every layer

    @classmethod
    def of(cls, config, name: str) -> HfArgs:
        return cls(str(name), config.model_type, config.to_json_string(use_diff=False))

    def sharded(self, tensor_parallel_size: int, expert_parallel_size: int = 1,
                layers: tuple | None = None) -> HfArgs:
        return HfArgs(self.name, self.model_type, self.config_json, tensor_parallel_size,
                      expert_parallel_size, layers)

    @functools.cached_property
    def config(self):
        """The whole model's transformers config."""
        import transformers  # deferred: heavy to import
        data = json.loads(self.config_json)
        data.pop("model_type", None)
        return transformers.AutoConfig.for_model(self.model_type, **data)

    @functools.cached_property
    def rank(self):
        """One rank's config, every layer (rank_config())."""
        return self.rank_config()

    # what serve reads of any model (ModelArgs' names), one rank's
    @property
    def n_layer(self) -> int:
        """The rank's layers: its pipeline stage's, else every layer."""
        return len(self.kinds) if self.layers is not None else self.config.num_hidden_layers

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.rank.vocab_size

    @property
    def block_size(self) -> int:
        return self.config.max_position_embeddings

    @property
    def n_head(self) -> int:
        return self.rank.num_attention_heads

    @property
    def n_local_heads(self) -> int:
        return getattr(self.rank, "num_key_value_heads", None) or self.n_head

    @property
    def head_dim(self) -> int:
        return getattr(self.rank, "head_dim", None) or self.dim // self.n_head

    @property
    def num_experts(self) -> int:
        """Routed experts one rank holds (E / EP)."""
        return int(_first(self.rank, EXPERTS))

    @property
    def num_activated_experts(self) -> int:
        return int(_first(self.rank, TOP_K)) if self.num_experts else 0

    @property
    def intermediate_size(self) -> int:
        """The widest feed-forward a token runs (dense, or k experts' together)."""
        c = self.rank
        moe = (getattr(c, "moe_intermediate_size", None) or c.intermediate_size) \
            * self.num_activated_experts if self.num_experts else 0
        return max(getattr(c, "intermediate_size", 0) or 0, moe)

    sliding_window = None  # per layer: kv_layout's layer types (ragged_hf.layer_local)
    attention_bias = False
    tie_embeddings = False

    @property
    def kinds(self) -> list[str]:
        """Each of the rank's layers' kind (derive_layers.layer_kinds): its stage's."""
        kinds = layer_kinds(self.config)
        return kinds if self.layers is None else kinds[slice(*self.layers)]

    def rank_config(self, kinds: list[str] | None = None):
        """The config one rank's model is built from (the module doc), with one layer per
        entry of `kinds` (layer_kinds' names; None: every layer of the rank's stage)."""
        tp, ep, whole = self.tensor_parallel_size, self.expert_parallel_size, self.config
        if kinds is None and self.layers is not None:
            kinds = self.kinds
        config = copy.deepcopy(whole) if kinds is None else \
            with_layers(whole, arranged(whole, kinds))
        if ep > 1:  # E / EP whole experts a rank, routed to by its top-k of them (module doc)
            field = next(f for f in EXPERTS if getattr(config, f, None))
            setattr(config, field, getattr(whole, field) // ep)
        if tp == 1:
            return config
        heads = whole.num_attention_heads
        kv = getattr(whole, "num_key_value_heads", None) or heads
        config.head_dim = getattr(whole, "head_dim", None) or whole.hidden_size // heads
        config.num_attention_heads = heads // tp
        if hasattr(config, "num_key_value_heads"):
            config.num_key_value_heads = max(1, kv // tp)
        for field in WIDTHS:  # under EP over TP x DP too: E / DP experts, each 1 / TP wide
            if getattr(config, field, None):
                setattr(config, field, getattr(config, field) // tp)
        config.vocab_size = padded_vocab(whole.vocab_size, tp)
        return config

    def weight_params(self) -> int:
        """Parameters one rank holds: transformers' model of one layer per kind, each
        layer's parameters times its kind's layers (a tied embedding once)."""
        return _weight_params(self)

    def weight_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one rank's weights: as the checkpoint stores them (hf_stored.py: fp8
        blocks, mxfp4 experts), the others at `dtype`."""
        return _weight_bytes(self, dtype)

    @property
    def stored(self) -> StoredFormat | None:
        """The checkpoint's stored format (its quantization_config), None: float."""
        return StoredFormat.of(self.config)

    def kv_elements_per_token(self) -> int:
        """K and V elements a token adds to one rank's cache over every layer, as vLLM
        stores it (kv_layout: MLA's latent and rope key, replicated for every rank)."""
        config = self.rank_config()
        return sum(layer.elements for layer in kv_layout.kv_layers(config, "engine"))

    def __repr__(self) -> str:
        stage = "" if self.layers is None else f", layers={self.layers[0]}-{self.layers[1] - 1}"
        return (f"HfArgs({self.name!r}, {self.model_type}, tp={self.tensor_parallel_size}, "
                f"ep={self.expert_parallel_size}{stage})")


def rank_model_kinds(args: HfArgs) -> list[str]:
    """One layer of each kind, in an order the config can say."""
    kinds = args.kinds
    return arranged(args.config, list(dict.fromkeys(kinds)))


@functools.lru_cache(maxsize=32)
def _weight_params(args: HfArgs) -> int:
    outside, per_kind = kind_params(args)
    return outside + sum(per_kind[kind] for kind in args.kinds)


@functools.lru_cache(maxsize=32)
def kind_params(args: HfArgs) -> tuple[int, dict]:
    """(parameters outside the layers (a tied weight once), {kind: one layer's parameters})
    of one rank of `args`, from transformers' model of one layer per kind."""
    reps = rank_model_kinds(args)
    model, _ = fake_hf_model(args.rank_config(reps), dtype=torch.bfloat16)
    outside, per_kind = 0, dict.fromkeys(reps, 0)
    for name, p in model.named_parameters():
        layer = layer_of(name)
        if layer >= 0:
            per_kind[reps[layer]] += p.numel()
        else:
            outside += p.numel()
    return outside, per_kind






@functools.lru_cache(maxsize=32)
def _weight_bytes(args: HfArgs, dtype: torch.dtype) -> int:
    reps = rank_model_kinds(args)
    model, _ = fake_hf_model(args.rank_config(reps), dtype=dtype)
    count = {kind: args.kinds.count(kind) for kind in reps}
    stored, total = args.stored, 0
    for name, p in model.named_parameters():  # a tied weight once
        layer = layer_of(name)
        nbytes = stored.nbytes(name, p) if stored is not None else None
        total += (p.numel() * p.element_size() if nbytes is None else nbytes) * \
            (count[reps[layer]] if layer >= 0 else 1)
    return total


def check_tensor_parallel(args: HfArgs, tp: int) -> None:
    """TP that divides the heads, KV heads that TP divides or that divide TP, feed-forward
    widths TP divides; ValueError in one line naming the field."""
    config = args.config
    heads = config.num_attention_heads
    if heads % tp:
        raise ValueError(f"--tensor_parallel_size {tp} does not divide num_attention_heads "
                         f"{heads} (valid: a divisor of {heads})")
    kv = getattr(config, "num_key_value_heads", None) or heads
    if not getattr(config, "kv_lora_rank", None) and kv % tp and tp % kv:
        raise ValueError(f"--tensor_parallel_size {tp}: num_key_value_heads {kv} is neither "
                         f"divisible by it nor divides it")
    for field in WIDTHS:
        width = getattr(config, field, None)
        if width and width % tp:
            raise ValueError(f"--tensor_parallel_size {tp} does not divide {field} {width}")






def valid_tensor_parallel_sizes(args: HfArgs) -> list[int]:
    """The TP sizes check_tensor_parallel takes, up to the heads."""
    heads = args.config.num_attention_heads
    out = []
    for tp in range(1, heads + 1):
        try:
            check_tensor_parallel(args, tp)
        except ValueError:
            continue
        out.append(tp)
    return out


def tp_rules(full_model, rank_model, tp: int) -> dict[str, str]:
    """{module path (layer index as *): the rule that divided it} for every linear of a rank's
    model of one layer per kind, checked against the config's base_model_tp_plan: "colwise"
    (out_features / TP), "rowwise" (in_features / TP), "replicated"; ValueError naming a
    module the plan divides otherwise."""
    plan = getattr(full_model.config, "base_model_tp_plan", None) or {}
    full = dict(full_model.named_modules())
    out = {}
    for name, m in rank_model.named_modules():
        if not isinstance(m, torch.nn.Linear) or name not in full:
            continue
        f = full[name]
        rule = "colwise" if m.out_features * tp == f.out_features and \
            m.in_features == f.in_features else "rowwise" if \
            m.in_features * tp == f.in_features and m.out_features == f.out_features else \
            "replicated" if (m.in_features, m.out_features) == (f.in_features, f.out_features) \
            else "other"
        key = _plan_key(name)
        given = next((v for k, v in plan.items() if key.endswith(k)), None)
        if given in ("colwise", "rowwise") and rule != given and not name.endswith("lm_head"):
            raise ValueError(f"{name}: the config's tensor-parallel plan says {given}, the "
                             f"sharded sizes give {rule}")
        out[key] = rule
    return out


def _plan_key(name: str) -> str:
    parts = name.split(".")
    return ".".join("*" if p.isdigit() else p for p in parts)


def padded_vocab(vocab: int, tp: int) -> int:
    return math.ceil(math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING / tp)
