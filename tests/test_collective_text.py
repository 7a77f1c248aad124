"""helpers.launcher.collective_text: how a crash report names the group a rank's collective runs in."""
import sys

import cloudpickle
import pytest
import torch.distributed as dist

from helpers import launch
from helpers.launcher.collective_text import _group_text

# Rank functions travel by value: by reference every rank would import this module, and pytest with it
# (0.16-0.2 CPU-s a rank, in every launch).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(60)


def group_texts():
    default = dist.distributed_c10d._get_default_group()
    pair = dist.new_group([0, 1])
    return [_group_text(default), _group_text(default.group_name), _group_text(pair),
            _group_text(pair.group_name), _group_text("no such group")]


def test_groups_and_group_names_are_named_without_raising():
    # Functional collectives (DTensor's full_tensor(), FSDP2) hold the group's name, a str, in their `group`
    # argument; get_process_group_ranks raised KeyError on it, in the thread that answers the kernel's reports.
    texts = launch(group_texts, 2)
    assert texts[0][:3] == [None, None, "ranks [0, 1]"]
    assert texts[0][3].startswith("group '") and texts[0][4] == "group 'no such group'"
    assert texts[0] == texts[1]
