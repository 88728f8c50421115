"""Lab backend: real hosts listed in an Ansible inventory, reached over SSH (paramiko).

One module per job:
  inventory.py     the inventory read into `LabHostSpec`s (every key it reads, documented there)
  host_facts.py    the program a host runs to report its facts (sent as source; imports nothing of the testbed)
  facts.py         what the controller makes of those facts (fit to take part? versions agree? status fields)
  remote.py        processes started detached on a host (`LabRankProcess`) and the shell lines that poll and end them
  host_shaping.py  shaping every host's data NIC through the host tool, commit-confirmed (`LabShaping`)
  provision.py     the package files the hosts install and the Ansible run that installs them
  cluster.py       `LabCluster`: the `Cluster` interface over those (bring-up transaction, start, fetch, status, down)

The names below are re-exported so `from testbed.cluster.lab import LabCluster` keeps working.
"""

from testbed.cluster.lab.cluster import LabCluster
from testbed.cluster.lab.facts import HOST_FACTS, MIN_PYTHON, evaluate_facts, version_disagreements
from testbed.cluster.lab.host_shaping import DEFAULT_CONFIRM_WITHIN_S
from testbed.cluster.lab.inventory import (
    DEFAULT_PROJECT_DIR,
    DEFAULT_PYTHON,
    DEFAULT_RUN_DIR,
    DEFAULT_SHAPING_HELPER,
    LabHostSpec,
    inventory_peers,
    load_inventory,
)
from testbed.cluster.lab.provision import SOURCE_FILES, accept_new_ssh_args, stage_source
from testbed.cluster.lab.remote import (
    TOKEN_ENV,
    LabRankProcess,
    command_for,
    end_processes_script,
    kill_group_script,
    poll_status_line,
)

__all__ = [
    "DEFAULT_CONFIRM_WITHIN_S",
    "DEFAULT_PROJECT_DIR",
    "DEFAULT_PYTHON",
    "DEFAULT_RUN_DIR",
    "DEFAULT_SHAPING_HELPER",
    "HOST_FACTS",
    "MIN_PYTHON",
    "SOURCE_FILES",
    "TOKEN_ENV",
    "LabCluster",
    "LabHostSpec",
    "LabRankProcess",
    "accept_new_ssh_args",
    "command_for",
    "end_processes_script",
    "evaluate_facts",
    "inventory_peers",
    "kill_group_script",
    "load_inventory",
    "poll_status_line",
    "stage_source",
    "version_disagreements",
]
