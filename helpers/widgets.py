"""Interactive front ends over helpers.theory: the model-state memory calculator of chapter 06.

    calc = MemoryCalculator(params_billion=7.5, dp=64)
    calc                       # displays controls, stacked bars (GB = 1e9 bytes per device) and a total
    calc.bars()                # the numbers drawn, e.g. {"ZeRO-3": {"params": 0.23, ..., "total": 1.88}}

Nothing is created at import; the figure is a plain matplotlib Figure (no pyplot state) rendered to PNG
inside an ipywidgets.Image, so it draws the same in JupyterLab, in saved notebooks and headless tests.
"""
import contextlib
import io

import ipywidgets as widgets
from matplotlib.figure import Figure

from helpers.theory import CONVENTIONS, GB, optimizer_k, shard_degree, strategy_memory

# Label shown -> strategy name in helpers.theory. FSDP names map to ZeRO stages: NO_SHARD = DDP (0),
# SHARD_GRAD_OP = ZeRO-2, FULL_SHARD = ZeRO-3, HYBRID_SHARD = FULL_SHARD within a group, DDP across.
STRATEGY_LABELS = {
    "DDP": "ddp", "ZeRO-1": "zero1", "ZeRO-2": "zero2", "ZeRO-3": "zero3",
    "NO_SHARD": "no_shard", "SHARD_GRAD_OP": "shard_grad_op", "FULL_SHARD": "full_shard",
    "HYBRID_SHARD": "hybrid_shard",
}
# Optimizer state K follows from the optimizer and the convention: fp32 states (Adam: momentum +
# variance = 8, SGD with momentum = 4, plain SGD = 0) plus a 4-byte fp32 master copy whenever the
# parameters are stored in half precision (param_bytes < 4). Adam under the ZeRO paper's convention
# gives its K = 12; SGD with momentum gives 8; plain SGD 4.
OPTIMIZERS = {"Adam": "adam", "SGD + momentum": "sgd_momentum", "SGD": "sgd"}
CATEGORIES = ("params", "grads", "optimizer")
COLORS = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}


def _convention_label(name):
    """Dropdown text for a byte convention, e.g. 'zero_paper_mixed_adam: 2 B params + 2 B grads'."""
    c = CONVENTIONS[name]
    return f"{name}: {c['param_bytes']} B params + {c['grad_bytes']} B grads"


def _make_controls(params_billion, dp, strategy, convention, optimizer, budget_gb, group_size,
                   compare_all):
    """The calculator's input widgets, keyed by setting name."""
    style = {"description_width": "10em"}
    return {
        "params_billion": widgets.BoundedFloatText(
            value=params_billion, min=1e-6, max=1e6, step=0.5, description="parameters (billions)",
            style=style),
        "dp": widgets.BoundedIntText(value=dp, min=1, max=1_000_000, description="DP degree (ranks)",
                                     style=style),
        "strategy": widgets.Dropdown(options=list(STRATEGY_LABELS), value=strategy,
                                     description="strategy", style=style),
        "group_size": widgets.BoundedIntText(value=group_size, min=1, max=1_000_000,
                                             description="HYBRID_SHARD group", style=style),
        "convention": widgets.Dropdown(options=[(_convention_label(n), n) for n in CONVENTIONS],
                                       value=convention, description="bytes convention",
                                       style=style),
        "optimizer": widgets.Dropdown(options=list(OPTIMIZERS), value=optimizer,
                                      description="optimizer", style=style),
        "budget_gb": widgets.BoundedFloatText(value=budget_gb, min=0, max=1e6, step=8,
                                              description="device budget (GB, 0 = none)",
                                              style=style),
        "compare_all": widgets.Checkbox(value=compare_all, description="compare all strategies"),
    }


class MemoryCalculator:
    """Model-state memory per device (GB = 1e9 bytes) for DDP, ZeRO-1/2/3 and FSDP strategies."""

    def __init__(self, params_billion=7.5, dp=64, strategy="ZeRO-3",
                 convention="zero_paper_mixed_adam", optimizer="Adam", budget_gb=32.0,
                 group_size=8, compare_all=True):
        self.controls = _make_controls(params_billion, dp, strategy, convention, optimizer,
                                       budget_gb, group_size, compare_all)
        self.total_label = widgets.Label()
        self.figure = Figure(figsize=(8, 3.6))
        self.figure.subplots_adjust(left=0.08, right=0.98, top=0.9, bottom=0.25)  # fixed: fast redraws
        self.ax = self.figure.add_subplot()
        self.image = widgets.Image(format="png")
        self.widget = widgets.VBox([widgets.HBox([
            widgets.VBox([self.controls[k] for k in ("params_billion", "dp", "strategy", "group_size")]),
            widgets.VBox([self.controls[k] for k in ("convention", "optimizer", "budget_gb",
                                                     "compare_all")]),
        ]), self.image, self.total_label])
        self._held = False
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.update()

    def _repr_mimebundle_(self, **kwargs):
        """Display the calculator's widget when the object ends a notebook cell."""
        return self.widget._repr_mimebundle_(**kwargs)

    def settings(self):
        """Current inputs in theory's units: num_params, world_size, k, param_bytes, grad_bytes, group_size."""
        c = {name: control.value for name, control in self.controls.items()}
        convention = CONVENTIONS[c["convention"]]
        master_weights = convention["param_bytes"] < 4  # half-precision params -> fp32 master copy
        return {
            "num_params": c["params_billion"] * 1e9,
            "world_size": c["dp"],
            "k": optimizer_k(OPTIMIZERS[c["optimizer"]], master_weights=master_weights),
            "param_bytes": convention["param_bytes"],
            "grad_bytes": convention["grad_bytes"],
            "group_size": c["group_size"],
        }

    def memory_gb(self, label):
        """{'params', 'grads', 'optimizer', 'total'} in GB per device for one strategy label."""
        s = self.settings()
        strategy = STRATEGY_LABELS[label]
        group_size = s["group_size"] if strategy == "hybrid_shard" else None
        memory = strategy_memory(s["num_params"], s["world_size"], strategy, s["k"],
                                 param_bytes=s["param_bytes"], grad_bytes=s["grad_bytes"],
                                 group_size=group_size)
        return {name: value / GB for name, value in memory.items()}

    def _hybrid_possible(self):
        """Whether the HYBRID_SHARD group size divides the DP degree."""
        try:
            shard_degree("hybrid_shard", self.controls["dp"].value, self.controls["group_size"].value)
        except ValueError:
            return False
        return True

    def shown_labels(self):
        """Strategy labels drawn: all (HYBRID_SHARD only when its group fits) or just the selected one."""
        selected = self.controls["strategy"].value
        if not self.controls["compare_all"].value:
            return [selected]
        return [label for label in STRATEGY_LABELS
                if label != "HYBRID_SHARD" or label == selected or self._hybrid_possible()]

    def bars(self):
        """The numbers drawn: {strategy label: {'params', 'grads', 'optimizer', 'total'} in GB per device}."""
        return {label: self.memory_gb(label) for label in self.shown_labels()}

    def _on_change(self, change):
        """Observer: any control changed, so recompute and redraw (unless updates are held)."""
        if not self._held:
            self.update()

    @contextlib.contextmanager
    def hold_updates(self):
        """Set several controls with one redraw at the end: `with calc.hold_updates(): ...`."""
        self._held = True
        try:
            yield self
        finally:
            self._held = False
            self.update()

    def update(self):
        """Recompute the bars and the total; show theory's error message instead if inputs are invalid."""
        try:
            bars = self.bars()
        except ValueError as error:
            self._draw_error(str(error))
            self.total_label.value = f"Cannot compute: {error}"
        else:
            self._draw(bars)
            self.total_label.value = self._total_text(bars)
        self._render()

    def _total_text(self, bars):
        """One line: the selected strategy's total and its parts, the convention and the budget verdict."""
        label = self.controls["strategy"].value
        m, s = self.memory_gb(label), self.settings()
        text = (f"{label}: {m['total']:.2f} GB per device = params {m['params']:.2f} + grads "
                f"{m['grads']:.2f} + optimizer {m['optimizer']:.2f} GB "
                f"({s['param_bytes']}+{s['grad_bytes']}+{s['k']} bytes/param before sharding; "
                "GB = 1e9 bytes)")
        budget = self.controls["budget_gb"].value
        if budget > 0:
            verdict = "fits in" if m["total"] <= budget else "exceeds"
            text += f"; {verdict} the {budget:g} GB budget"
        if "HYBRID_SHARD" not in bars and self.controls["compare_all"].value:
            text += "; HYBRID_SHARD hidden: its group size must divide the DP degree"
        return text

    def _draw(self, bars):
        """Stacked bars (params, grads, optimizer) per strategy, plus the budget line."""
        ax, labels = self.ax, list(bars)
        ax.clear()
        ax.set_axis_on()  # _draw_error may have turned it off
        x = range(len(labels))
        bottom = [0.0] * len(labels)
        for name in CATEGORIES:
            heights = [bars[label][name] for label in labels]
            ax.bar(x, heights, bottom=bottom, label=name, color=COLORS[name])
            bottom = [b + h for b, h in zip(bottom, heights)]
        budget = self.controls["budget_gb"].value
        if budget > 0:
            ax.axhline(budget, color="black", linestyle="--", label=f"budget {budget:g} GB")
        ax.set_xticks(list(x), [self._tick_text(label) for label in labels], rotation=20,
                      ha="right")
        for tick, label in zip(ax.get_xticklabels(), labels):
            if label == self.controls["strategy"].value:
                tick.set_fontweight("bold")
        if len(labels) == 1:
            ax.set_xlim(-1.5, 1.5)  # a lone bar would otherwise fill the whole axes
        ax.set_ylabel("GB per device (1e9 bytes)")
        c = self.controls
        ax.set_title(f"Model states: {c['params_billion'].value:g}B parameters, "
                     f"DP degree {c['dp'].value}, {c['optimizer'].value}")
        ax.legend(loc="upper right", fontsize="small")

    def _tick_text(self, label):
        """Axis text for a bar: the strategy label, with the group size for HYBRID_SHARD."""
        if label == "HYBRID_SHARD":
            return f"HYBRID_SHARD (group {self.controls['group_size'].value})"
        return label

    def _draw_error(self, message):
        """Replace the bars with the error message."""
        self.ax.clear()
        self.ax.set_axis_off()
        self.ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True,
                     transform=self.ax.transAxes)

    def _render(self):
        """Render the figure to PNG bytes in the Image widget (works with any matplotlib backend)."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=72)
        self.image.value = buffer.getvalue()
