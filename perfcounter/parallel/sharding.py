"""One rank of a model sharded as vLLM and Megatron shard it: the shapes that rank holds.

    parallel = ParallelConfig(tensor_parallel_size=4)
    rank = rank_args(ModelArgs.from_name("llama-3.1-70b"), parallel)  # RankArgs: a ModelArgs
    Transformer(rank)   # one rank's model: counted, priced and fitted in memory as any model

vLLM's parallel sizes (its flag names): tensor (TP), pipeline (PP) and data (DP) parallel,
and expert parallelism over the TP x DP ranks. A rank's ModelArgs are the full model's with
the sharded dimensions divided, so that its FLOPs and bytes are counted from the shapes it
holds, never divided afterwards:
- attention: heads n_head / TP (column-parallel wqkv, row-parallel wo); KV heads
  n_local_heads / TP when there are at least TP of them, else each rank holds one KV head
  (replicated, as vLLM's QKVParallelLinear does);
- feed-forward: intermediate_size / TP (column-parallel w1, w3; row-parallel w2); a mixture of
  experts without expert parallelism splits each expert's intermediate the same way;
- vocabulary: the embedding table and the LM head hold ceil(V' / TP) rows, V' the vocabulary
  padded to a multiple of 64 (vLLM's VocabParallelEmbedding);
- norms and biases of the output dimension stay whole on every rank (replicated);
- pipeline: a stage holds ceil(n_layer / PP) layers. NB: the rank model keeps both the
  embedding and the LM head (the first stage holds one, the last the other): its weights
  exceed a stage's by the smaller of the two;
- experts (--enable_expert_parallel, EP = TP x DP): a rank holds E / EP whole experts (not
  split by TP) and routes over all E (the router is replicated); each token's k rows go to
  their experts' ranks and back (all-to-all dispatch and combine), the rank's experts running
  the T k rows it receives, as many as it sends when routing is balanced. NB: with TP > 1 the
  TP ranks of a replica hold the same tokens and each dispatches all of them here (vLLM
  splits them among the TP ranks first): the experts' work is then an upper bound by TP.
The rank's collectives (model.py: after wo and w2, the embedding's all-reduce, the head's
all-gather, the stage's send/recv, the experts' all-to-all) span `tensor_parallel_size`,
`pipeline_parallel_size` and the expert-parallel size.

A configuration that the engines refuse is refused here, before anything is counted, in one
line naming the value and what would be valid (ParallelError, a ValueError): TP that does
not divide the heads, KV heads neither divisible by TP nor dividing it, an intermediate size
TP does not divide, more stages than layers, expert parallelism on a dense model.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from perfcounter.models.args import ModelArgs
from perfcounter.pricing.collectives import check_link

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


class ParallelError(ValueError):
    """A parallel configuration that cannot shard the model (one line: the value, what is valid)."""


@dataclass(frozen=True)
class ParallelConfig:
    """vLLM's parallel sizes; `gpus` = TP x PP x DP."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False

    def __post_init__(self):
        for name in SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelError(f"--{name} {value!r}: expected an integer >= 1")
        if not isinstance(self.enable_expert_parallel, bool):
            raise ParallelError(f"--enable_expert_parallel {self.enable_expert_parallel!r}: "
                                "expected True or False")

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def ranks(self) -> int:
        """Devices one replica runs on: TP x PP (a step's joules are every one's)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def expert_parallel_size(self) -> int:
        """Ranks the experts are split over: TP x DP with expert parallelism (vLLM), else 1."""
        return self.tensor_parallel_size * self.data_parallel_size \
            if self.enable_expert_parallel else 1

    @property
    def sharded(self) -> bool:
        """Whether one rank holds less than the whole model (TP, PP or EP above 1)."""
        return self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1 \
            or self.expert_parallel_size > 1

    def label(self) -> str:
        """'TP4', 'TP2 PP2 DP2 EP4' (the sizes above 1), '' for one device."""
        parts = [f"{k}{v}" for k, v in (("TP", self.tensor_parallel_size),
                                         ("PP", self.pipeline_parallel_size),
                                         ("DP", self.data_parallel_size),
                                         ("EP", self.expert_parallel_size)) if v > 1]
        return " ".join(parts)


@dataclass(repr=False)
class RankArgs(ModelArgs):
    """One rank's shapes (the module doc) and the group sizes its collectives span."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    full_n_layer: int = 0  # the whole model's layers (a stage holds n_layer of them)
    # expert parallelism: the rank holds num_experts (E / EP) and routes each token to
    # routed_top_k of all E (num_activated_experts: at most the experts it holds); 0: as the
    # model's num_activated_experts
    routed_top_k: int = 0
    # NB: repr=False keeps ModelArgs' repr, which shows these fields too


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_tensor_parallel_sizes(args: ModelArgs) -> list[int]:
    """The TP sizes that shard `args` (heads, KV heads and intermediate size), up to n_head."""
    return [tp for tp in divisors(args.n_head) if _tp_problem(args, tp) is None]


def _tp_problem(args: ModelArgs, tp: int) -> str | None:
    if args.n_head % tp:
        return f"does not divide the {args.n_head} attention heads"
    kv = args.n_local_heads
    if kv % tp and tp % kv:
        return f"neither divides the {kv} KV heads nor is a multiple of them"
    if args.intermediate_size % tp:
        return f"does not divide the feed-forward's intermediate size {args.intermediate_size}"
    return None


def check_parallel(args: ModelArgs, parallel: ParallelConfig, model: str = "the model") -> None:
    """ParallelError (one line) when `parallel` cannot shard `args` (the module doc)."""
    tp = parallel.tensor_parallel_size
    problem = _tp_problem(args, tp)
    if problem is not None:
        valid = ", ".join(map(str, valid_tensor_parallel_sizes(args)))
        raise ParallelError(f"--tensor_parallel_size {tp} {problem} of {model}; valid: {valid}")
    pp = parallel.pipeline_parallel_size
    if pp > args.n_layer:
        raise ParallelError(f"--pipeline_parallel_size {pp}: {model} has {args.n_layer} layers, "
                            f"at most one stage each; valid: 1..{args.n_layer}")
    if parallel.enable_expert_parallel:
        if not args.num_experts:
            raise ParallelError(f"--enable_expert_parallel: {model} is dense (no experts to "
                                "split); leave it out, or give a mixture of experts")
        ep = parallel.expert_parallel_size
        if args.num_experts % ep:
            valid = ", ".join(str(d) for d in divisors(args.num_experts))
            raise ParallelError(f"--enable_expert_parallel splits the {args.num_experts} experts "
                                f"of {model} over TP x DP = {ep} ranks, which does not divide "
                                f"them; valid TP x DP: {valid}")


def padded_vocab(vocab_size: int) -> int:
    """The vocabulary padded to a multiple of VOCAB_PADDING (vLLM's pad_vocab_size)."""
    return -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def rank_args(args: ModelArgs, parallel: ParallelConfig | None = None,
              model: str = "the model") -> ModelArgs:
    """The shapes one rank holds (the module doc); `args` itself when nothing is sharded
    (data parallelism alone replicates the whole model)."""
    parallel = parallel or ParallelConfig()
    check_parallel(args, parallel, model)
    if not parallel.sharded:
        return args
    tp, pp, ep = (parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                  parallel.expert_parallel_size)
    experts = args.num_experts // ep if args.num_experts else 0
    split_ffn = not args.num_experts or ep == 1  # experts split by EP keep their whole width
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(ModelArgs)}
    fields.update(
        n_head=args.n_head // tp,
        n_local_heads=max(args.n_local_heads // tp, 1),
        vocab_size=args.vocab_size if tp == 1 else -(-padded_vocab(args.vocab_size) // tp),
        intermediate_size=args.intermediate_size // tp if split_ffn else args.intermediate_size,
        n_layer=math.ceil(args.n_layer / pp),
        num_experts=experts,
        num_activated_experts=min(args.num_activated_experts, experts),
    )
    return RankArgs(**fields, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                    expert_parallel_size=ep, full_n_layer=args.n_layer,
                    routed_top_k=args.num_activated_experts if ep > 1 else 0)


def shard(args: ModelArgs, model: str = "the model", *, tensor_parallel_size: int = 1,
          pipeline_parallel_size: int = 1, data_parallel_size: int = 1,
          enable_expert_parallel: bool = False, mapping: bool = False, gguf: bool = False,
          expert_load: bool = False) -> tuple[ParallelConfig, ModelArgs]:
    """(the ParallelConfig, one rank's args) of a deployment of `args`, checked before any
    work (ParallelError, one line); refused beside what prices one device its own way: a
    placement mapping (its `tp=` option), a llama.cpp file (its layers store their own types)
    and a skewed expert load under expert parallelism (its weights are per expert of all)."""
    parallel = ParallelConfig(tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
                              enable_expert_parallel)
    if parallel.gpus > 1 or parallel.enable_expert_parallel:
        given = ", ".join(f"--{k}" for k, v in (
            ("tensor_parallel_size", parallel.tensor_parallel_size > 1),
            ("pipeline_parallel_size", parallel.pipeline_parallel_size > 1),
            ("data_parallel_size", parallel.data_parallel_size > 1),
            ("enable_expert_parallel", parallel.enable_expert_parallel)) if v)
        for refused, why in ((mapping, "a placement mapping shards with its own tp= option"),
                             (gguf, "a llama.cpp file's layers are priced unsharded"),
                             (expert_load and parallel.expert_parallel_size > 1,
                              "a skewed --expert_load is given per expert of the whole model")):
            if refused:
                raise ParallelError(f"{given}: {why}; leave one of them out")
    return parallel, rank_args(args, parallel, model)


def check_links(spec, parallel: ParallelConfig) -> None:
    """LinkError (one line) when the ranks of `parallel` on `spec` have no link to run their
    collectives over (a CPU, a device without interconnect or host link figures)."""
    for ranks in (parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                  parallel.expert_parallel_size):
        check_link(spec, ranks)
