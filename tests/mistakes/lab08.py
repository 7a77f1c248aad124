"""Lab 08 (ZeRO-3 / FSDP from scratch): chunks without padding, a shard that is a view, an unsharded buffer never
freed, views cut off from autograd, gradients summed or overwritten, a training loop built in the wrong order; and in
mixed precision, a float32 reduction taken for the default, a gather or a reduction in the wrong dtype, a bfloat16
gradient on the float32 shard, a compute dtype never passed on, units given by type taken for names."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "08_zero_3_fsdp.ipynb"

# 8.1's solution, with {keep}, {shard}, {dtypes}, {delete}, {flat} and {free} replaceable
_INIT = '''
class FlatShard(FlatShard):
    def __init__(self, module, param_dtype=None, reduce_dtype=None):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        params = [(name.rpartition("."), p) for name, p in module.named_parameters()]
        params = [(prefix, attr, p) for (prefix, _, attr), p in params if {keep}]
        self.module = module
        self.param_infos = [(module.get_submodule(prefix), attr) for prefix, attr, _ in params]
        self.shapes, self.numels = [p.shape for *_, p in params], [p.numel() for *_, p in params]
        self.numel = sum(self.numels)
        size = math.ceil(self.numel / world_size)
        self.padded_numel = size * world_size
        flat = torch.cat([p.detach().reshape(-1) for *_, p in params])
        flat = torch.cat([flat, flat.new_zeros(self.padded_numel - self.numel)])
        self.flat_shard = nn.Parameter({shard})
        {dtypes}
        {delete}
        module.register_parameter("flat_shard", self.flat_shard)
        self.flat = {flat}
        {free}
'''
_RIGHT = dict(keep='attr != "flat_shard"', shard="flat[rank * size : (rank + 1) * size].clone()",
              dtypes="self.param_dtype = param_dtype or flat.dtype\n"
                     "        self.reduce_dtype = reduce_dtype or self.param_dtype",
              delete="for owner, attr in self.param_infos:\n            delattr(owner, attr)",
              flat="torch.zeros_like(flat, dtype=self.param_dtype, requires_grad=True)",
              free="self.flat.untyped_storage().resize_(0)")


def _init(**changes):
    return _INIT.format(**{**_RIGHT, **changes})


def _method(source):
    """A method of FlatShard redefined, as the lab's cells do (add_to_class)."""
    return "\n@add_to_class(FlatShard)\n" + source


_UNSHARD = '''def unshard(self):
    self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())
    dist.all_gather_single(self.flat.data, self.flat_shard.data.to(self.param_dtype))
    views = self.flat.split(self.numels + [self.padded_numel - self.numel])
    for (owner, attr), view, shape in zip(self.param_infos, views, self.shapes):
        setattr(owner, attr, view.view(shape))
'''

_REDUCE = '''def reduce_scatter_grads(self):
    grad = self.flat_shard.new_empty(self.flat_shard.shape, dtype=self.reduce_dtype)
    dist.reduce_scatter_single(grad, self.flat.grad.to(self.reduce_dtype))
    grad = grad.div_(dist.get_world_size()).to(self.flat_shard.dtype)
    if self.flat_shard.grad is None:
        self.flat_shard.grad = grad
    else:
        self.flat_shard.grad += grad
    self.flat.grad = None
'''

_TRAIN = '''
def train_fsdp(model, units, batches, *, lr, momentum, param_dtype=None, reduce_dtype=None):
    modules = []
    for unit in units:
        if isinstance(unit, str):
            modules.append(model.get_submodule(unit))
        else:
            modules += [m for m in model.modules() if isinstance(m, unit) and m is not model]
    units = [FlatShard(m, param_dtype, reduce_dtype) for m in [*modules, model]]
    for unit in units:
        unit.register_hooks()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x).float(), y).backward()
        optimizer.step()
    return units
'''

MISTAKES = [
    Mistake("8.1", "torch.tensor_split of the unpadded flat parameter (unequal shards)", _init(
        shard="torch.cat([p.detach().reshape(-1) for *_, p in params]).tensor_split(world_size)[rank].clone()"),
            ("Pad the flat parameter with zeros", "its shards are unequal")),
    Mistake("8.1", "the shard is a view of the full buffer (no clone)", _init(
        shard="flat[rank * size : (rank + 1) * size]"), ("storage of its own", "clone() the slice")),
    Mistake("8.1", "the original parameters left on their modules", _init(delete="pass"),
            ("other parameters left", "the originals deleted")),
    Mistake("8.1", "the unsharded buffer allocated at once", _init(free="pass"),
            ("holds no memory until unshard()", "untyped_storage().resize_(0)")),
    Mistake("8.1", "an inner unit's flat_shard taken again", _init(keep="True"),
            ("inner unit's flat_shard", "skip the parameters named flat_shard")),
    Mistake("8.1", "reduce_dtype None taken for float32", _init(
        dtypes=_RIGHT["dtypes"].replace("reduce_dtype or self.param_dtype", "reduce_dtype or torch.float32")),
            ("reduce_dtype None means the compute dtype", "not float32")),
    Mistake("8.1", "the unsharded buffer in the shard's dtype",
            _init(flat="torch.zeros_like(flat, requires_grad=True)"),
            ("self.flat is (dtype, shape, storage bytes) ('torch.float32'", "in param_dtype")),
    Mistake("8.1", "the shard itself cast to param_dtype", _init(
        shard="flat[rank * size : (rank + 1) * size].clone().to(param_dtype or flat.dtype)"),
            ("flat_shard is torch.bfloat16", "the master copy the optimizer steps")),

    Mistake("8.2", "the views made under torch.no_grad()", _method(_UNSHARD.replace(
        "    views = self.flat.split", "    with torch.no_grad():\n        views = self.flat.split").replace(
        "    for (owner, attr), view, shape in zip(self.param_infos, views, self.shapes):\n        setattr",
        "        for (owner, attr), view, shape in zip(self.param_infos, views, self.shapes):\n            setattr")),
            ("not views of self.flat made with autograd", "not under torch.no_grad()")),
    Mistake("8.2", "the views wrapped in nn.Parameter", _method(_UNSHARD.replace(
        "view.view(shape))", "nn.Parameter(view.view(shape)))")),
            ("not views of self.flat made with autograd", "split self.flat itself")),
    Mistake("8.2", "a new buffer every unshard", _method(_UNSHARD.replace(
        "    self.flat.untyped_storage().resize_(self.padded_numel * self.flat.element_size())\n",
        "    self.flat = torch.zeros(self.padded_numel, requires_grad=True)\n")),
            ("self.flat is the same tensor: False", "the same tensor (the hooks are registered on it)")),
    Mistake("8.2", "gathered in float32, then cast", _method(_UNSHARD.replace(
        "    dist.all_gather_single(self.flat.data, self.flat_shard.data.to(self.param_dtype))\n",
        "    full = self.flat_shard.new_empty(self.padded_numel)\n"
        "    dist.all_gather_single(full, self.flat_shard.data)\n    self.flat.data.copy_(full)\n")),
            ("expected [('all_gather', 96)], half of float32's bytes", "BEFORE the all-gather")),
    Mistake("8.2", "the float32 shard gathered into a bfloat16 flat", _method(_UNSHARD.replace(
        ".to(self.param_dtype))", ")")), ("unshard raised", "cast to param_dtype")),

    Mistake("8.3", "references dropped, storage kept", _method('''def reshard(self):
    for owner, attr in self.param_infos:
        if attr in owner.__dict__:
            delattr(owner, attr)
'''), ("Dropping references frees nothing", "untyped_storage().resize_(0)")),
    Mistake("8.3", "a new empty buffer instead of freeing this one", _method('''def reshard(self):
    self.flat = torch.zeros(self.padded_numel, requires_grad=True)
    self.flat.untyped_storage().resize_(0)
    for owner, attr in self.param_infos:
        if attr in owner.__dict__:
            delattr(owner, attr)
'''), ("replaced self.flat by a new tensor", "Resize self.flat's own storage to 0")),
    Mistake("8.3", "delattr whether or not a view is set", _method('''def reshard(self):
    self.flat.untyped_storage().resize_(0)
    for owner, attr in self.param_infos:
        delattr(owner, attr)
'''), ("already sharded", "must do nothing")),
    Mistake("8.3", "the views left on the modules", _method('''def reshard(self):
    self.flat.untyped_storage().resize_(0)
'''), ("still have", "delete them from their owners (delattr)")),

    Mistake("8.4", "the sum, not the mean", _method(_REDUCE.replace(".div_(dist.get_world_size())", "")),
            ("SUM over the 3 ranks", "divide by the world size")),
    Mistake("8.4", "the shard's gradient overwritten, not accumulated", _method(_REDUCE.replace(
        "    if self.flat_shard.grad is None:\n        self.flat_shard.grad = grad\n    else:\n"
        "        self.flat_shard.grad += grad\n", "    self.flat_shard.grad = grad\n")),
            ("overwrote", "add it to flat_shard.grad")),
    Mistake("8.4", "the full gradient kept", _method(_REDUCE.replace("    self.flat.grad = None\n", "")),
            ("bytes of gradient", "set self.flat.grad = None")),
    Mistake("8.4", "all-reduce, then slice", _method('''def reduce_scatter_grads(self):
    full = self.flat.grad / dist.get_world_size()
    dist.all_reduce(full)
    size, rank = self.flat_shard.numel(), dist.get_rank()
    grad = full[rank * size : (rank + 1) * size].clone()
    self.flat_shard.grad = grad if self.flat_shard.grad is None else self.flat_shard.grad + grad
    self.flat.grad = None
'''), ("all_reduce", "one dist.reduce_scatter_single")),
    Mistake("8.4", "reduced in the compute dtype whatever reduce_dtype", _method(_REDUCE.replace(
        "dtype=self.reduce_dtype)", "dtype=self.param_dtype)").replace(
        "self.flat.grad.to(self.reduce_dtype)", "self.flat.grad")),
            ("with reduce_dtype torch.float32", "cast flat.grad to reduce_dtype")),
    Mistake("8.4", "the mean left in bfloat16", _method(_REDUCE.replace(
        ".div_(dist.get_world_size()).to(self.flat_shard.dtype)", ".div_(dist.get_world_size())")),
            ("raised", "cast the mean to flat_shard's dtype (float32)")),

    Mistake("8.5", "the optimizer built before sharding", _TRAIN.replace(
        "    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)\n", "").replace(
        "    units = [",
        "    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)\n    units = ["),
            ("never changed", "build the optimizer AFTER the units")),
    Mistake("8.5", "no hooks registered", _TRAIN.replace(
        "    for unit in units:\n        unit.register_hooks()\n", ""),
            ("no parameter during forward", "call register_hooks() on every unit"), run_fails=True),
    Mistake("8.5", "gradients never zeroed", _TRAIN.replace("        optimizer.zero_grad(set_to_none=True)\n", ""),
            ("gradients accumulate across steps", "optimizer.zero_grad()")),
    Mistake("8.5", "param_dtype never passed to the units", _TRAIN.replace(
        "FlatShard(m, param_dtype, reduce_dtype)", "FlatShard(m)"),
            ("differs from FSDP2 with MixedPrecisionPolicy", "It equals the float32 run")),
    Mistake("8.5", "every unit taken as a name", _TRAIN.replace(
        "        if isinstance(unit, str):\n            modules.append(model.get_submodule(unit))\n        else:\n"
        "            modules += [m for m in model.modules() if isinstance(m, unit) and m is not model]\n",
        "        modules.append(model.get_submodule(unit))\n"),
            ("train_fsdp(model, (Block,)", "units may hold module types")),
]
