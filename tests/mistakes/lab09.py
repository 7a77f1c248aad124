"""Lab 09 (PyTorch FSDP): the wrong rules for choosing a strategy, fully_shard's reshard_after_forward and units,
and a budgeted run that uses the wrong byte convention, measures at one point only or returns local shards."""
import nbformat

from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "09_pytorch_fsdp.ipynb"
# the lab's imports cell also sets these; definitions() keeps only its imports
_GIVEN = '''
STRATEGY_ORDER = ("no_shard", "shard_grad_op", "hybrid_shard", "full_shard")
FP32_ADAM = {"k": 8, "param_bytes": 4, "grad_bytes": 4}
NATIVE_TOOL = {"no_shard": "ddp", "shard_grad_op": "zero2", "hybrid_shard": "hsdp", "full_shard": "fsdp"}
'''

def _solution_cell(cell_id, old, new):
    """The solution's answer cell with one edit (which must apply: the solution may have changed)."""
    source = next(c.source for c in nbformat.read(SOLUTION, as_version=4).cells if c.get("id") == cell_id)
    assert source.count(old) == 1, f"{cell_id}: {old!r} is not in the solution once; update the mistake"
    return source.replace(old, new)


# 9.1's solution with its memory test, cost, comparison or convention replaceable
_CHOOSE = '''
def choose_strategy(num_params, world_size, memory_budget_bytes, *, group_size=None, k=12, param_bytes=2,
                    grad_bytes=2):
    best = None
    for strategy in STRATEGY_ORDER:
        if strategy == "hybrid_shard" and group_size is None:
            continue
        group = group_size if strategy == "hybrid_shard" else None
        memory = theory.strategy_memory(num_params, world_size, strategy, {convention}, group_size={memory_group})
        memory = memory["total"]
        if {too_big}:
            continue
        sent = {cost}
        if best is None or sent {better} best[0]:
            best = (sent, strategy)
    return best[1] if best else None
'''
_RIGHT = dict(convention="k, param_bytes=param_bytes, grad_bytes=grad_bytes", memory_group="group",
              too_big="memory > memory_budget_bytes", better="<",
              cost='theory.comm_volume(strategy, num_params, world_size, group_size=group, kind="wire")')


def _choose(**changes):
    return _CHOOSE.format(**{**_RIGHT, **changes})


_APPLY = '''
def apply_strategy(model, mesh, strategy, block_types):
    if strategy == "no_shard":
        return DDP(model, process_group=mesh.get_group())
    reshard = {reshard}
    for module in reversed(list(model.modules())):
        if {blocks} isinstance(module, tuple(block_types)) and module is not model:
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    return fully_shard(model, mesh=mesh{root})
'''


def _apply(reshard='strategy != "shard_grad_op"', blocks="", root=", reshard_after_forward=reshard"):
    return _APPLY.format(reshard=reshard, blocks=blocks, root=root)


_MISTAKES = [
    Mistake("9.1", "the least memory instead of the least communication", _choose(cost="memory"),
            ("least memory", "least COMMUNICATION among those that fit")),
    Mistake("9.1", "logical bytes instead of wire bytes", _choose(
        cost="theory.comm_volume(strategy, num_params, world_size, group_size=group)"),
            ("LOGICAL bytes", "kind='wire'")),
    Mistake("9.1", "hybrid_shard's memory sharded over all ranks", _choose(memory_group="None if group is None "
                                                                                        "else world_size"),
            ("shards over group_size ranks only", "group_size=group_size")),
    Mistake("9.1", "a budget that must be strictly larger", _choose(too_big="memory >= memory_budget_bytes"),
            ("strictly larger", "fits (<=)")),
    Mistake("9.1", "a tie goes to the later strategy", _choose(better="<="),
            ("EARLIER strategy in STRATEGY_ORDER",)),
    Mistake("9.1", "the byte convention ignored", _choose(convention="12"),
            ("default 2 + 2 + 12", "pass k, param_bytes and grad_bytes")),

    Mistake("9.2", "the root left at reshard_after_forward's default", _apply(root=""),
            ("root was not resharded", "reshard_after_forward=True to every unit, root included")),
    Mistake("9.2", "shard_grad_op resharded after forward", _apply(reshard="True"),
            ("shard_grad_op keeps the gathered parameters", "reshard_after_forward=False")),
    Mistake("9.2", "only the root sharded", _apply(blocks="False and"),
            ("one per Layer", "call fully_shard on every module of a block type first")),
]

_TRAIN = '''
_train = train_within_budget

def train_within_budget(make_model, batches, memory_budget_bytes, *, lr, block_types):
    {body}
'''

_MISTAKES += [
    # 9.3's own line: choose_strategy called without the convention (9.1's answer is not the mistake: the grader
    # runs 9.3 with the solution's 9.1)
    Mistake("9.3", "the strategy chosen with the 2 + 2 + 12 convention",
            _solution_cell("lab09-q3", "memory_budget_bytes, **FP32_ADAM)", "memory_budget_bytes)"),
            ("default 2 + 2 + 12", "**FP32_ADAM")),
    Mistake("9.3", "local shards returned, not full parameters", _TRAIN.format(body='''
    result = _train(make_model, batches, memory_budget_bytes, lr=lr, block_types=block_types)
    model = make_model()
    shards = dist.get_world_size() if result["strategy"] != "no_shard" else 1
    result["params"] = [p.reshape(p.shape[0], -1)[: -(-p.shape[0] // shards)].reshape(-1, *p.shape[1:])
                        for p in result["params"]]
    return result'''), ("return the FULL parameters", "full_tensor()")),
]


def _framework(*edits):
    """9.4's solution with each (old, new) applied."""
    source = _solution_cell("lab09-q4", *edits[0])
    for old, new in edits[1:]:
        assert source.count(old) == 1, f"lab09-q4: {old!r} is not in the solution once; update the mistake"
        source = source.replace(old, new)
    return source


_MISTAKES += [
    Mistake("9.4", "the strategy with the least memory, not the fastest",
            _framework(("best = min(fitting, key=seconds.get)", "best = min(fitting, key=memory)")),
            ("rule 1 (PyTorch keeps up) takes the FASTEST strategy that fits",)),
    Mistake("9.4", "a budget that must be strictly larger", _framework(
        ("fitting = [st for st in STRATEGY_ORDER if memory(st) <= s.gpu_bytes]",
         "fitting = [st for st in STRATEGY_ORDER if memory(st) < s.gpu_bytes]")), ("exactly the budget fits (<=)",)),
    Mistake("9.4", "PyTorch whether or not the communication hides under backward", _framework(
        ("if seconds[best] <= simulate.BACKWARD_SHARE * s.compute_s or not deepspeed:", "if True:")),
            ("applies first", "does not hide under backward")),
    Mistake("9.4", "DeepSpeed for a stack that needs PyTorch", _framework(
        ("deepspeed = not s.native_stack", "deepspeed = True")),
            ("needs DeepSpeed, and native_stack=True keeps the run in PyTorch",)),
    Mistake("9.4", "1-bit Adam on a sharded model", _framework(
        ('if "no_shard" in fitting:', "if fitting:")),
            ("needs DDP's 16 Ψ to fit", "refuses 1-bit Adam with ZeRO")),
    Mistake("9.4", "ZeRO++ without hpZ's secondary copy", _framework(
        ('zeropp = memory("full_shard") + 2 * psi / g', 'zeropp = memory("full_shard")')),
            ("ZeRO-3 alone", "hpZ keeps a secondary copy")),
    Mistake("9.4", "logical bytes instead of wire bytes", _framework(
        ('bytes_per_element=bytes_per_element, kind="wire")', "bytes_per_element=bytes_per_element)")),
            ("LOGICAL bytes", "kind='wire'")),
    Mistake("9.4", "HSDP's memory sharded over all ranks", _framework(
        ('theory.strategy_memory(psi, n, st, group_size=g if st == "hybrid_shard" else None',
         'theory.strategy_memory(psi, n, st, group_size=n if st == "hybrid_shard" else None')),
            ("sharding over all N ranks", "group_size=gpus_per_node")),
    Mistake("9.4", "FSDP2's CPU offload before ZeRO-Offload", _framework(
        ("    if deepspeed and memory(\"shard_grad_op\", k=0, grad_bytes=0) <= s.gpu_bytes",
         "    if 16 * share <= s.cpu_bytes:\n        return choice(\"fsdp_cpu_offload\", 0.0, sent(\"full_shard\"))\n"
         "    if deepspeed and memory(\"shard_grad_op\", k=0, grad_bytes=0) <= s.gpu_bytes")),
            ("rule 5 (ZeRO-Offload) applies first",)),
    Mistake("9.4", "NVMe for a stack that needs PyTorch", _framework(
        ("if deepspeed and 16 * share <= s.nvme_bytes:", "if 16 * share <= s.nvme_bytes:")),
            ("rule 7 (ZeRO-Infinity) needs DeepSpeed",)),
]

MISTAKES = [Mistake(m.question, m.name, _GIVEN + m.override, m.first_line, m.run_fails) for m in _MISTAKES]
