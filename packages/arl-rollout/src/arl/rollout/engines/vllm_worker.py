"""Runs inside vLLM's worker process(es): receives weights from arl-sync and loads them in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so `collective_rpc("arl_receive_weights")`
calls it where the model lives, with no extra copy through the engine's front process; with tensor
parallelism every TP rank runs it and receives the full tensors (the model's loaders keep the rank's
shard). The receiver is created on first use and reused across syncs (its staging buffer and transport
mappings too); it stages the whole transfer before `apply` runs, so a failed transfer leaves the old
weights untouched.

Loading: on CUDA the tensors go straight through the model's own `load_weights` (the per-parameter
weight loaders copy, fuse and shard them into the existing parameter storage: CUDA graphs stay valid,
nothing is re-processed). vLLM's `reload_weights` is not used there: it rebuilds every layer on the
meta device, re-materialises and re-processes it and copies it back, which costs far more than the
copy itself. On CPU it is needed: vLLM's CPU build prepacks linear weights after loading, and only the
reload re-runs that step.
"""

from __future__ import annotations

import time
from typing import Any


class WeightSyncExtension:
    """Mixed into vLLM's Worker; methods are prefixed `arl_` to stay clear of vLLM's own."""

    _arl_receiver: Any = None
    _arl_address: str | None = None

    def _arl_device(self) -> Any:
        import torch

        device = getattr(self, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            return device
        return None

    def arl_receive_weights(self, sync_address: str, sync_config_json: bytes) -> dict[str, Any]:
        """One sync: returns the version applied and the seconds spent receiving and applying."""
        import msgspec

        from arl.sync import SyncConfig, WeightReceiver

        t0 = time.perf_counter()
        if self._arl_receiver is None or self._arl_address != sync_address:
            if self._arl_receiver is not None:
                self._arl_receiver.close()
            config = msgspec.json.decode(sync_config_json, type=SyncConfig)
            # Stage on this worker's GPU whatever the transport (host-staged "cpu" included), so
            # the load below is a device copy.
            self._arl_receiver = WeightReceiver(sync_address, config, device=self._arl_device())
            self._arl_address = sync_address
        timing: dict[str, float] = {}

        def apply(named: Any) -> None:
            t_apply = time.perf_counter()
            timing["receive_s"] = t_apply - t0
            self._arl_apply(named)
            timing["apply_s"] = time.perf_counter() - t_apply

        version = self._arl_receiver.receive(apply=apply)
        # 1.0 when the load went in place through the model's loaders, 0.0 when through reload_weights.
        timing["inplace"] = float(self._arl_device() is not None and not self._arl_inplace_failed)
        return {"version": version, **timing}

    _arl_inplace_failed: str = ""

    def _arl_apply(self, named_tensors: Any) -> None:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        if self._arl_device() is not None and not self._arl_inplace_failed:
            named_tensors = list(named_tensors)  # views of the staging buffer: cheap, and reusable below
            try:
                self._arl_load_in_place(model, named_tensors)
                return
            except Exception as exc:  # a model whose loaders need vLLM's reload machinery: use it from now on
                import logging

                self._arl_inplace_failed = f"{type(exc).__name__}: {exc}"
                logging.getLogger(__name__).warning(
                    "arl: in-place weight load failed (%s); using vLLM's reload_weights",
                    self._arl_inplace_failed,
                )
        self.reload_weights(weights_iterator=iter(named_tensors))  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        # vLLM's CPU build keeps a prepacked copy of a tied lm_head that reload_weights does not refresh;
        # re-running its post-load step makes log probs match the new weights exactly.
        if lm_head is not None and hasattr(
            getattr(lm_head, "quant_method", None), "process_weights_after_loading"
        ):
            lm_head.quant_method.process_weights_after_loading(lm_head)

    def _arl_load_in_place(self, model: Any, named_tensors: Any) -> None:
        import torch

        try:
            from vllm.config import set_current_vllm_config
        except ImportError:  # pragma: no cover - older vLLM
            set_current_vllm_config = None
        with torch.no_grad():
            if set_current_vllm_config is not None and getattr(self, "vllm_config", None) is not None:
                with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                    model.load_weights(weights=iter(named_tensors))
            else:
                model.load_weights(weights=iter(named_tensors))
        # The copies were queued on this stream; the staging buffer they read is rewritten by the
        # next sync, so they must have landed before this call returns.
        torch.cuda.current_stream().synchronize()

    def arl_parameter_sizes(self) -> list[tuple[str, int]]:
        """(name, bytes) of every parameter of this worker, in the model's order."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return [(name, p.numel() * p.element_size()) for name, p in model.named_parameters()]

    def arl_named_parameters(self, names: list[str] | None = None) -> bytes:
        """The worker's parameters (those in `names`, default all) as safetensors bytes (tensors do not
        cross vLLM's RPC pickling)."""
        from safetensors.torch import save

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        wanted = set(names) if names is not None else None
        return save(
            {
                name: p.detach().to("cpu").contiguous()
                for name, p in model.named_parameters()
                if wanted is None or name in wanted
            }
        )

    def arl_parameter_digests(self) -> dict[str, Any]:
        """Every parameter's fingerprint (`weights_digest`), computed on the worker's device: a check
        of the engine's weights that moves integers, not tensors."""
        import msgspec
        import torch

        from arl.rollout.engines.weights_digest import engine_digests

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return msgspec.to_builtins(engine_digests(model.named_parameters()))

    def arl_ping(self) -> int:
        """A no-op RPC: measures the engine's control-call round trip (benchmarks/vllm_call_latency.py)."""
        return 0
