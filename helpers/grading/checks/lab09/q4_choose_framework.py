"""Checks of lab 9.4: choose_framework, DDP, FSDP2 or DeepSpeed for a scenario, judged rule by rule.

The rules are the lab's (RULES, in order; the first that applies decides). `decide` applies them with the course's own
formulas (helpers.theory) and simulator (helpers.simulate), and `diagnose` compares an answer with it: a wrong tool is
named by the rule the choice broke (its own rule's condition that does not hold here, or the earlier rule that applies
first), a wrong number by the formula to use. The public check runs SCENARIOS, one or more per branch of the rules; the
hidden test runs `secret_scenarios(seed)`, the same branches in the same order with other sizes, judged by the same
`diagnose` in the grader. Messages print the scenario's inputs and the answer's own values, never the right numbers.
"""
import math
import random
from typing import NamedTuple

from helpers import simulate, theory
from helpers.grading.registry import answer, public_check

GB = theory.GB


class Scenario(NamedTuple):
    """One training job: the model, the cluster, and what the rest of the stack needs (the lab defines the same)."""

    num_params: float                  # Ψ
    nodes: int
    gpus_per_node: int
    gpu_bytes: float                   # model-state budget per GPU (activations and buffers already set aside)
    compute_s: float                   # forward + backward of one step on one GPU
    nic_bytes_per_s: float = 25e9      # one NIC, per direction
    nics_per_node: int = 8
    nvlink_bytes_per_s: float = 300e9  # per GPU, per direction
    cpu_bytes: float = 1e12            # host memory per node for offloaded model states
    nvme_bytes: float = 0.0            # NVMe per node for offloaded model states
    native_stack: bool = False         # the run needs DTensor TP/PP, torch.compile or torchtitan: PyTorch only


STRATEGY_ORDER = ("no_shard", "shard_grad_op", "hybrid_shard", "full_shard")
NATIVE = {"no_shard": "ddp", "shard_grad_op": "zero2", "hybrid_shard": "hsdp", "full_shard": "fsdp"}
TOOLS = ("ddp", "zero2", "hsdp", "fsdp", "1bit_adam", "zero++", "zero_offload", "fsdp_cpu_offload", "zero_infinity")
# (name, when it applies): the lab's table, in order.
RULES = {
    1: ("PyTorch keeps up", "the fastest of DDP, ZeRO-2, HSDP and FSDP that fits, when its communication hides under "
                            "backward or the stack needs PyTorch"),
    2: ("1-bit Adam", "DDP fits, the fastest fitting strategy does not hide under backward, and DeepSpeed is allowed"),
    3: ("ZeRO++", "DDP does not fit, the fastest fitting strategy does not hide under backward, DeepSpeed is allowed "
                  "and ZeRO-3 plus hpZ's copy (16 Ψ / N + 2 Ψ / g) fits"),
    4: ("PyTorch, network-bound", "a strategy fits but neither 1-bit Adam nor ZeRO++ applies"),
    5: ("ZeRO-Offload", "nothing fits on the GPUs, DeepSpeed is allowed, the fp16 parameters (2 Ψ) fit on a GPU and a "
                        "node's CPU memory holds its GPUs' gradient and optimizer shards, 14 Ψ / N each"),
    6: ("FSDP2 CPU offload", "nothing fits on the GPUs and a node's CPU memory holds its GPUs' 16 Ψ / N"),
    7: ("ZeRO-Infinity", "nothing fits on the GPUs or in CPU memory, DeepSpeed is allowed and a node's NVMe holds its "
                         "GPUs' 16 Ψ / N"),
    8: ("nothing fits", "no rule above applies: None (more GPUs, or another axis of parallelism)"),
}
RULE_OF = {"1bit_adam": 2, "zero++": 3, "zero_offload": 5, "fsdp_cpu_offload": 6, "zero_infinity": 7, None: 8}
KEYS = ("tool", "memory_per_gpu", "bytes_per_step")


# ------------------------------------------------------------------------------------------------ the rules
class _Facts:
    """Every quantity the rules read, computed once for a scenario with helpers.theory and helpers.simulate."""

    def __init__(self, s):
        self.s, self.n, self.g, psi = s, s.nodes * s.gpus_per_node, s.gpus_per_node, s.num_params
        network = simulate.Network("scenario", s.gpus_per_node, s.nvlink_bytes_per_s, s.nics_per_node,
                                   s.nic_bytes_per_s)
        self.memory = {st: self.state(st) for st in STRATEGY_ORDER}
        self.seconds = {st: simulate.strategy_comm_time_s(st, psi, self.n, network) for st in STRATEGY_ORDER}
        self.fitting = [st for st in STRATEGY_ORDER if self.memory[st] <= s.gpu_bytes]
        self.native = min(self.fitting, key=self.seconds.get) if self.fitting else None  # ties: the earlier
        self.hidden_s = simulate.BACKWARD_SHARE * s.compute_s
        self.keeps_up = self.native is not None and self.seconds[self.native] <= self.hidden_s
        self.zeropp_memory = self.memory["full_shard"] + 2 * psi / self.g
        self.offload_gpu = self.state("shard_grad_op", k=0, grad_bytes=0)  # fp16 parameters only
        self.node_share = psi * self.g / self.n  # the parameters whose states a node's GPUs hold

    def state(self, strategy, **convention):
        group = self.g if strategy == "hybrid_shard" else None
        return theory.strategy_memory(self.s.num_params, self.n, strategy, group_size=group, **convention)["total"]

    def sent(self, strategy, bytes_per_element=2):
        group = self.g if strategy == "hybrid_shard" else None
        return theory.comm_volume(strategy, self.s.num_params, self.n, group_size=group,
                                  bytes_per_element=bytes_per_element, kind="wire")

    def zeropp_sent(self):
        psi = self.s.num_params  # qwZ: INT8 all-gather over all; hpZ: bf16 all-gather in the node; qgZ: INT4 gradients
        return (theory.ring_wire_bytes("all_gather", psi, self.n)
                + theory.ring_wire_bytes("all_gather", 2 * psi, self.g)
                + theory.ring_wire_bytes("reduce_scatter", psi / 2, self.n))

    def applies(self, rule):
        """Whether rule's own condition holds (regardless of the rules before it)."""
        s, deepspeed = self.s, not self.s.native_stack
        return {1: self.native is not None and (self.keeps_up or s.native_stack),
                2: deepspeed and "no_shard" in self.fitting and not self.keeps_up,
                3: deepspeed and "no_shard" not in self.fitting and self.native is not None and not self.keeps_up
                and self.zeropp_memory <= s.gpu_bytes,
                4: self.native is not None,
                5: deepspeed and not self.fitting and self.offload_gpu <= s.gpu_bytes
                and 14 * self.node_share <= s.cpu_bytes,
                6: not self.fitting and 16 * self.node_share <= s.cpu_bytes,
                7: deepspeed and not self.fitting and 16 * self.node_share <= s.nvme_bytes,
                8: True}[rule]

    def answer(self, rule):
        """The answer rule gives: {'tool', 'memory_per_gpu', 'bytes_per_step'}."""
        native = self.native
        tool, memory, sent = {
            1: lambda: (NATIVE.get(native), self.memory.get(native), native and self.sent(native)),
            2: lambda: ("1bit_adam", self.memory["no_shard"], self.sent("no_shard", 1 / 8)),
            3: lambda: ("zero++", self.zeropp_memory, self.zeropp_sent()),
            4: lambda: (NATIVE.get(native), self.memory.get(native), native and self.sent(native)),
            5: lambda: ("zero_offload", self.offload_gpu, self.sent("shard_grad_op")),
            6: lambda: ("fsdp_cpu_offload", 0.0, self.sent("full_shard")),
            7: lambda: ("zero_infinity", 0.0, self.sent("full_shard")),
            8: lambda: (None, None, None),
        }[rule]()
        return {"tool": tool, "memory_per_gpu": memory, "bytes_per_step": sent}


def decide(s):
    """(the rule that decides, its answer) for scenario s: the reference the checks judge with."""
    facts = _Facts(s)
    rule = next(r for r in RULES if facts.applies(r))
    return rule, facts.answer(rule)


# ------------------------------------------------------------------------------------------------ the diagnosis
def _gb(nbytes):
    return f"{nbytes / GB:.4g} GB"


def _why_not(facts, tool, rule):
    """Why `tool` is not the choice, `rule` deciding: the condition of the tool's own rule that fails, else the rule
    that applies first."""
    s, g = facts.s, facts.g
    mine = 1 if tool in NATIVE.values() else RULE_OF[tool]
    deepspeed_only = f"rule {mine} ({RULES[mine][0]}) needs DeepSpeed, and native_stack=True keeps the run in PyTorch"
    if tool in NATIVE.values():
        strategy = next(st for st, t in NATIVE.items() if t == tool)
        if strategy not in facts.fitting:
            return (f"rule 1 ({RULES[1][0]}) takes only a strategy that fits: {tool}'s model states need "
                    f"{_gb(facts.memory[strategy])} per GPU, over the {_gb(s.gpu_bytes)} budget")
        if strategy != facts.native and facts.memory[facts.native] == s.gpu_bytes:
            return (f"rule 1 ({RULES[1][0]}): a strategy whose model states need exactly the budget fits (<=), and "
                    f"{NATIVE[facts.native]} needs exactly {_gb(s.gpu_bytes)}")
        if strategy != facts.native:
            return (f"rule 1 ({RULES[1][0]}) takes the FASTEST strategy that fits, by simulate.strategy_comm_time_s "
                    f"(ties to the earlier in STRATEGY_ORDER): {tool} is slower than another that fits")
        return (f"rule {rule} ({RULES[rule][0]}) applies first: {tool}'s communication, "
                f"{facts.seconds[strategy]:.3g} s, does not hide under backward (BACKWARD_SHARE x compute_s = "
                f"{facts.hidden_s:.3g} s) and the stack allows DeepSpeed")
    if mine in (2, 3, 5, 7) and s.native_stack:
        return deepspeed_only
    if mine == 2 and "no_shard" not in facts.fitting:
        return ("rule 2 (1-bit Adam) needs DDP's 16 Ψ to fit: DeepSpeed's engine refuses 1-bit Adam with ZeRO "
                f"(16 Ψ = {_gb(facts.memory['no_shard'])} per GPU, budget {_gb(s.gpu_bytes)})")
    if mine == 3 and "no_shard" in facts.fitting and facts.applies(2):
        return "rule 2 (1-bit Adam) applies first: DDP fits, so the all-reduce is compressed rather than sharded"
    if mine == 3 and facts.native is not None and facts.zeropp_memory > s.gpu_bytes:
        return (f"rule 3 (ZeRO++) needs ZeRO-3's states plus hpZ's secondary copy, 16 Ψ / N + 2 Ψ / g = "
                f"{_gb(facts.zeropp_memory)} per GPU, within the {_gb(s.gpu_bytes)} budget")
    if mine in (2, 3) and facts.native is not None and facts.keeps_up:
        return (f"rule 1 ({RULES[1][0]}) applies first: the fastest strategy that fits communicates for "
                f"{facts.seconds[facts.native]:.3g} s, which hides under backward "
                f"(BACKWARD_SHARE x compute_s = {facts.hidden_s:.3g} s)")
    if mine in (5, 6, 7) and facts.fitting:
        return (f"rules 5 to 7 (offload) are for a model that fits on no GPU: {NATIVE[facts.native]} fits "
                f"(rule {rule}, {RULES[rule][0]})")
    if mine == 5 and facts.offload_gpu > s.gpu_bytes:
        return (f"rule 5 (ZeRO-Offload) keeps the whole fp16 parameters on every GPU, 2 Ψ = "
                f"{_gb(facts.offload_gpu)}, over the {_gb(s.gpu_bytes)} budget")
    if mine == 5 and 14 * facts.node_share > s.cpu_bytes:
        return (f"rule 5 (ZeRO-Offload) puts a node's {g} GPUs' gradient and optimizer shards, 14 Ψ g / N = "
                f"{_gb(14 * facts.node_share)}, in its CPU memory ({_gb(s.cpu_bytes)})")
    if mine == 6 and 16 * facts.node_share > s.cpu_bytes:
        return (f"rule 6 (FSDP2 CPU offload) puts a node's {g} GPUs' shards of everything, 16 Ψ g / N = "
                f"{_gb(16 * facts.node_share)}, in its CPU memory ({_gb(s.cpu_bytes)})")
    if mine == 7 and 16 * facts.node_share > s.nvme_bytes:
        return (f"rule 7 (ZeRO-Infinity) puts 16 Ψ g / N = {_gb(16 * facts.node_share)} per node on its NVMe "
                f"({_gb(s.nvme_bytes)})")
    return f"rule {rule} ({RULES[rule][0]}) applies first: {RULES[rule][1]}"


MEMORY_HINTS = {
    "ddp": "theory.strategy_memory(Ψ, N, 'no_shard')['total']",
    "zero2": "theory.strategy_memory(Ψ, N, 'shard_grad_op')['total']",
    "hsdp": "theory.strategy_memory(Ψ, N, 'hybrid_shard', group_size=gpus_per_node)['total']: HSDP shards over "
            "the GPUs of a node only",
    "fsdp": "theory.strategy_memory(Ψ, N, 'full_shard')['total']",
    "1bit_adam": "DDP's, theory.strategy_memory(Ψ, N, 'no_shard')['total']: 1-bit Adam compresses messages, not states",
    "zero++": "ZeRO-3's states plus hpZ's secondary copy of the fp16 weights over a node: "
              "theory.strategy_memory(Ψ, N, 'full_shard')['total'] + 2 Ψ / gpus_per_node",
    "zero_offload": "the fp16 parameters, whole on every GPU (the gradients leave for the CPU as they are produced): "
                    "theory.strategy_memory(Ψ, N, 'shard_grad_op', k=0, grad_bytes=0)['total']",
    "fsdp_cpu_offload": "0.0: CPUOffloadPolicy keeps every sharded state in CPU memory",
    "zero_infinity": "0.0: ZeRO-Infinity keeps every state on NVMe",
}
BYTES_HINTS = {
    "ddp": "theory.comm_volume('no_shard', Ψ, N, bytes_per_element=2, kind='wire')",
    "zero2": "theory.comm_volume('shard_grad_op', Ψ, N, bytes_per_element=2, kind='wire')",
    "hsdp": "theory.comm_volume('hybrid_shard', Ψ, N, group_size=gpus_per_node, bytes_per_element=2, kind='wire')",
    "fsdp": "theory.comm_volume('full_shard', Ψ, N, bytes_per_element=2, kind='wire')",
    "1bit_adam": "DDP's wire bytes at 1 bit per element: theory.comm_volume('no_shard', Ψ, N, "
                 "bytes_per_element=1 / 8, kind='wire')",
    "zero++": "each phase a ring at its own width: ring_wire_bytes('all_gather', Ψ x 1 byte (INT8), N) + "
              "('all_gather', Ψ x 2 bytes, gpus_per_node) + ('reduce_scatter', Ψ x 0.5 byte (INT4), N)",
    "zero_offload": "ZeRO-2's: theory.comm_volume('shard_grad_op', Ψ, N, bytes_per_element=2, kind='wire') (the PCIe "
                    "traffic to the CPU is not counted)",
    "fsdp_cpu_offload": "FSDP's: theory.comm_volume('full_shard', Ψ, N, bytes_per_element=2, kind='wire')",
    "zero_infinity": "ZeRO-3's: theory.comm_volume('full_shard', Ψ, N, bytes_per_element=2, kind='wire')",
}


def _number_hint(facts, tool, key, got):
    """What a wrong number probably is, else the formula to use."""
    if key == "bytes_per_step" and tool in NATIVE.values():
        strategy = next(st for st, t in NATIVE.items() if t == tool)
        group = facts.g if strategy == "hybrid_shard" else None
        logical = 2 * theory.comm_volume(strategy, facts.s.num_params, facts.n, group_size=group)
        if math.isclose(got, logical, rel_tol=1e-6):
            return "those are the LOGICAL bytes: kind='wire' counts what each rank sends in its ring"
        if math.isclose(got, facts.sent(strategy, 1), rel_tol=1e-6):
            return "those are elements: bf16 collectives send 2 bytes per element (bytes_per_element=2)"
    if key == "memory_per_gpu" and tool == "zero++" and math.isclose(got, facts.memory["full_shard"], rel_tol=1e-6):
        return "that is ZeRO-3 alone: hpZ keeps a secondary copy of the fp16 weights over a node, + 2 Ψ / gpus_per_node"
    if key == "memory_per_gpu" and tool == "hsdp" and math.isclose(got, facts.memory["full_shard"], rel_tol=1e-6):
        return "that is sharding over all N ranks: HSDP shards over the GPUs of a node only (group_size=gpus_per_node)"
    return "use " + (MEMORY_HINTS if key == "memory_per_gpu" else BYTES_HINTS)[tool]


def diagnose(label, s, got):
    """The first line of what is wrong with answer `got` for scenario s (label names it), or None."""
    rule, expected = decide(s)
    if not isinstance(got, dict) or set(got) != set(KEYS):
        return f"{label}: return a dict with exactly the keys {KEYS}; got {got!r:.80}"
    tool = got["tool"]
    if tool not in TOOLS and tool is not None:
        return f"{label}: 'tool' must be one of {TOOLS} or None; got {tool!r}"
    if tool != expected["tool"]:
        return f"{label}: {_why_not(_Facts(s), tool, rule)} (got {tool!r})"
    if tool is None:
        if got["memory_per_gpu"] is not None or got["bytes_per_step"] is not None:
            return f"{label}: when nothing fits (rule 8), memory_per_gpu and bytes_per_step are None too"
        return None
    facts = _Facts(s)
    for key in ("memory_per_gpu", "bytes_per_step"):
        value = got[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{label}: {key} must be a number of bytes; got {value!r:.40}"
        if not math.isclose(value, expected[key], rel_tol=1e-6, abs_tol=1e-3):
            hint = _number_hint(facts, tool, key, value)
            return f"{label}: {tool} is right (rule {rule}); its {key} {value:.6g}: {hint}"
    return None


# ------------------------------------------------------------------------------------------------ the scenarios
def _s(psi_b, nodes, per_node, budget_gb, compute_s, **more):
    return Scenario(psi_b * 1e9, nodes, per_node, budget_gb * GB, compute_s, **more)


# (branch, label, scenario): one or more per branch of the rules, in the rules' order; `decide` gives each branch's
# rule and tool (tests/test_lab09_checks.py holds the branch names against it).
SCENARIOS = [
    ("ddp", "1.5B on 4 x 8 GPUs, 60 GB each, 1 s of compute", _s(1.5, 4, 8, 60, 1.0)),
    ("ddp_at_budget", "1B on 2 x 8 GPUs, a budget of exactly 16 GB (<= fits)", _s(1, 2, 8, 16, 1.0)),
    ("zero2", "7B on 4 x 8 GPUs, 60 GB each", _s(7, 4, 8, 60, 1.0)),
    ("hsdp", "7B on 4 x 8 GPUs, 60 GB, one 25 GB/s NIC per node, 5 s of compute",
     _s(7, 4, 8, 60, 5.0, nics_per_node=1)),
    ("fsdp", "28B on 4 x 8 GPUs, 60 GB each", _s(28, 4, 8, 60, 2.0)),
    ("native_stack", "7B on 4 x 8 GPUs, 60 GB, one NIC per node, 0.2 s of compute, with TP and torch.compile",
     _s(7, 4, 8, 60, 0.2, nics_per_node=1, native_stack=True)),
    ("1bit_adam", "1.5B on 4 x 8 GPUs, 60 GB, one 12.5 GB/s NIC per node, 0.1 s of compute",
     _s(1.5, 4, 8, 60, 0.1, nics_per_node=1, nic_bytes_per_s=12.5e9)),
    ("zero++", "28B on 8 x 8 GPUs, 40 GB, one 25 GB/s NIC per node, 1 s of compute",
     _s(28, 8, 8, 40, 1.0, nics_per_node=1)),
    ("network_bound_native", "70B on 4 x 8 GPUs, 36 GB (FSDP fits, ZeRO++'s copy does not), 8 NICs, 1 s of compute",
     _s(70, 4, 8, 36, 1.0)),
    ("zero_offload", "13B on one GPU of 32 GB, 512 GB of CPU memory", _s(13, 1, 1, 32, 10.0, cpu_bytes=512 * GB)),
    ("fsdp_cpu_offload", "70B on 1 x 8 GPUs, 40 GB, 2 TB of CPU memory", _s(70, 1, 8, 40, 10.0, cpu_bytes=2000 * GB)),
    ("fsdp_cpu_offload_native", "13B on one GPU of 32 GB, 512 GB of CPU memory, with torch.compile",
     _s(13, 1, 1, 32, 10.0, cpu_bytes=512 * GB, native_stack=True)),
    ("zero_infinity", "200B on 1 x 8 GPUs, 40 GB, 1 TB of CPU memory, 6.4 TB of NVMe",
     _s(200, 1, 8, 40, 10.0, cpu_bytes=1000 * GB, nvme_bytes=6400 * GB)),
    ("none_native", "200B on 1 x 8 GPUs, 40 GB, 1 TB of CPU, 6.4 TB of NVMe, with TP",
     _s(200, 1, 8, 40, 10.0, cpu_bytes=1000 * GB, nvme_bytes=6400 * GB, native_stack=True)),
    ("none", "1000B on 1 x 8 GPUs, 80 GB, 1 TB of CPU memory, no NVMe",
     _s(1000, 1, 8, 80, 10.0, cpu_bytes=1000 * GB)),
]
BRANCH_TOOL = {"ddp": "ddp", "ddp_at_budget": "ddp", "zero2": "zero2", "hsdp": "hsdp", "fsdp": "fsdp",
               "native_stack": "hsdp", "1bit_adam": "1bit_adam", "zero++": "zero++", "network_bound_native": "fsdp",
               "zero_offload": "zero_offload", "fsdp_cpu_offload": "fsdp_cpu_offload",
               "fsdp_cpu_offload_native": "fsdp_cpu_offload", "zero_infinity": "zero_infinity", "none_native": None,
               "none": None}
BRANCH_RULE = {"native_stack": 1, "1bit_adam": 2, "zero++": 3, "network_bound_native": 4, "zero_offload": 5,
               "fsdp_cpu_offload": 6, "fsdp_cpu_offload_native": 6, "zero_infinity": 7, "none_native": 8, "none": 8}


def _draw(branch, rng):
    """A scenario of `branch` with sizes drawn from rng (a candidate: secret_scenarios keeps it if decide agrees)."""
    pick = rng.choice
    if branch == "ddp":
        return _s(pick((0.5, 1, 1.5, 2, 3)), pick((2, 4, 8)), 8, pick((60, 70, 80)), pick((1.0, 2.0)))
    if branch == "ddp_at_budget":
        psi_b = pick((0.5, 1, 2, 2.5))
        return _s(psi_b, pick((1, 2, 4)), 8, 16 * psi_b, 5.0)
    if branch == "zero2":
        return _s(pick((5, 6, 7, 9)), pick((4, 8)), 8, pick((60, 80)), pick((2.0, 4.0)))
    if branch == "hsdp":
        return _s(pick((5, 6, 7)), pick((4, 8)), 8, pick((60, 80)), 20.0, nics_per_node=1)
    if branch == "fsdp":
        return _s(pick((20, 28, 34)), pick((4, 8)), 8, pick((40, 60)), 5.0)
    if branch == "native_stack":
        return _s(pick((5, 6, 7)), pick((4, 8)), 8, pick((60, 80)), 0.1, nics_per_node=1, native_stack=True)
    if branch == "1bit_adam":
        return _s(pick((1, 1.5, 2)), pick((4, 8)), 8, pick((60, 80)), 0.05, nics_per_node=1,
                  nic_bytes_per_s=pick((6.25e9, 12.5e9)))
    if branch == "zero++":
        return _s(pick((20, 28)), pick((8, 16)), 8, pick((40, 60)), pick((0.5, 1.0)), nics_per_node=1)
    if branch == "network_bound_native":
        psi_b, nodes = pick((60, 70, 80)), 4
        full = 16 * psi_b / (nodes * 8)  # GB per GPU under FSDP; ZeRO++ needs + 2 psi_b / 8 more
        return _s(psi_b, nodes, 8, round(full + psi_b / 8, 2), 0.5)
    if branch in ("zero_offload", "fsdp_cpu_offload_native"):
        return _s(pick((10, 13, 15)), 1, 1, pick((32, 40)), 10.0, cpu_bytes=pick((256, 512)) * GB,
                  native_stack=branch.endswith("native"))
    if branch == "fsdp_cpu_offload":
        return _s(pick((60, 70, 90)), 1, 8, pick((24, 40)), 10.0, cpu_bytes=pick((1600, 2000)) * GB)
    if branch in ("zero_infinity", "none_native"):
        return _s(pick((150, 200, 250)), 1, 8, pick((24, 40)), 10.0, cpu_bytes=pick((512, 1000)) * GB,
                  nvme_bytes=pick((6400, 8000)) * GB, native_stack=branch == "none_native")
    return _s(pick((1000, 2000)), 1, 8, pick((40, 80)), 10.0, cpu_bytes=1000 * GB, nvme_bytes=pick((0, 1000)) * GB)


def secret_scenarios(seed):
    """[(label, Scenario)]: one scenario per branch of SCENARIOS, in their order, sizes drawn from seed."""
    rng = random.Random(seed)
    out = []
    for number, (branch, _, public) in enumerate(SCENARIOS, 1):
        for _ in range(50):
            s = _draw(branch, rng)
            if decide(s)[1]["tool"] == BRANCH_TOOL[branch] and decide(s)[0] == decide(public)[0]:
                break
        else:  # every branch's draws are tested to land (tests/test_lab09_checks.py): the public one stands in
            s = public
        out.append((f"hidden scenario {number} of {len(SCENARIOS)}: {_describe(s)}", s))
    return out


def _describe(s):
    extra = (f", {s.nics_per_node} NIC(s) of {s.nic_bytes_per_s / GB:g} GB/s per node, {s.compute_s:g} s of compute"
             f", CPU {s.cpu_bytes / GB:g} GB, NVMe {s.nvme_bytes / GB:g} GB per node"
             + (", native stack" if s.native_stack else ""))
    return f"{s.num_params / 1e9:g}B on {s.nodes} x {s.gpus_per_node} GPUs, {s.gpu_bytes / GB:g} GB each" + extra


def judge_answers(answers, seed, part=slice(None)):
    """The hidden test's judge: the answers to secret_scenarios(seed)[part], diagnosed in order; raises the first
    line."""
    scenarios = secret_scenarios(seed)[part]
    if not isinstance(answers, list) or len(answers) != len(scenarios):
        raise AssertionError(f"choose_framework must return one answer per scenario ({len(scenarios)})")
    for (label, s), got in zip(scenarios, answers):
        why = diagnose(label, s, got)
        if why:
            raise AssertionError(why)


# ------------------------------------------------------------------------------------------------ question 9.4
@public_check("9.4")
def every_rule_on_its_own_scenario(ns):
    choose = answer(ns, "choose_framework")
    for branch, label, s in SCENARIOS:
        why = diagnose(f"{label} [{branch}]", s, choose(s))
        if why:
            raise AssertionError(why)
