"""Runs inside vLLM's worker process: receives weights from arl-sync and loads them in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so `collective_rpc("arl_receive_weights")`
calls it where the model lives, with no extra copy through the engine's front process. The receiver is
created on first use and reused across syncs; it stages the whole transfer before `apply` runs, so a
failed transfer leaves the old weights untouched.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Mixed into vLLM's Worker; methods are prefixed `arl_` to stay clear of vLLM's own."""

    _arl_receiver: Any = None
    _arl_address: str | None = None

    def arl_receive_weights(self, sync_address: str, sync_config_json: bytes) -> int:
        import msgspec

        from arl.sync import SyncConfig, WeightReceiver

        if self._arl_receiver is None or self._arl_address != sync_address:
            if self._arl_receiver is not None:
                self._arl_receiver.close()
            config = msgspec.json.decode(sync_config_json, type=SyncConfig)
            self._arl_receiver = WeightReceiver(sync_address, config)
            self._arl_address = sync_address
        return self._arl_receiver.receive(apply=self._arl_apply)

    def _arl_apply(self, named_tensors: Any) -> None:
        self.reload_weights(weights_iterator=iter(named_tensors))  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        # vLLM's CPU build keeps a prepacked copy of a tied lm_head that reload_weights does not refresh;
        # re-running its post-load step makes log probs match the new weights exactly.
        if lm_head is not None and hasattr(getattr(lm_head, "quant_method", None), "process_weights_after_loading"):
            lm_head.quant_method.process_weights_after_loading(lm_head)

    def arl_named_parameters(self) -> bytes:
        """The worker's parameters as safetensors bytes (tensors do not cross vLLM's RPC pickling)."""
        from safetensors.torch import save

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return save({name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()})
