"""The one place where serve/ imports perfcounter's internals (by module path).

Everything else in perfcounter/serve/ imports these names from here, so that when a
module moves only this file changes. The public API (`perfcounter.simulate`,
`perfcounter.get_device_spec`, ...) is imported where it is used.
"""
from __future__ import annotations

from perfcounter._util import atomic_write, check_writable_target, did_you_mean  # noqa: F401
from perfcounter.costs.attention import window_pairs  # noqa: F401
from perfcounter.counter import TransformerPerformanceCounter  # noqa: F401
from perfcounter.devices import get_device_spec  # noqa: F401
from perfcounter.energy import PJ, compute_energy_j  # noqa: F401
from perfcounter.loading import fake_model  # noqa: F401
from perfcounter.model import ModelArgs, precompute_freqs_cis  # noqa: F401
from perfcounter.roofline import crosses_host_link, host_link_bytes, op_costs, roofline  # noqa: F401
from perfcounter.trace import ROLES, ModuleInfo, OpRecord, Trace  # noqa: F401
from perfcounter.config_only import resolve_config  # noqa: F401
from perfcounter.hf_checkpoint import model_args_from_hf  # noqa: F401
