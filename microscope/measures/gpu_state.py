"""The GPU's clock, power, temperature and throttle reasons, read through NVML between timed rounds.

A latency measured while the GPU ran at a power-capped clock is a different measurement from one at
full boost; without these readings a reviewer cannot tell a slower kernel from a hotter afternoon.
NVML (``pynvml``, shipped by the ``nvidia-ml-py`` package) is optional: where it is missing or does
not answer, ``GpuSampler.sample`` returns None and records simply carry no GPU state.
"""

from __future__ import annotations

from typing import Any

#: Clock-event (throttle) reason bits that mean "slowed down", and the words a report uses for them.
#: Idle, application-clock settings and display clocks are not slowdowns and are left out.
THROTTLE_REASONS: dict[int, str] = {
    0x0000000000000004: "power cap",
    0x0000000000000008: "hardware slowdown",
    0x0000000000000020: "thermal (software)",
    0x0000000000000040: "thermal (hardware)",
    0x0000000000000080: "power brake",
}


def throttle_words(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clock-event bit mask, in a fixed order."""
    return [word for bit, word in THROTTLE_REASONS.items() if mask & bit]


class GpuSampler:
    """Reads one GPU's state; ``sample()`` is cheap (a few NVML calls) and never raises.

    NVML opens at the first sample: the process that builds a runner only to plan a run never samples, and
    asking torch for its current device there would start CUDA in it for nothing.
    """

    def __init__(self, index: int | None = None) -> None:
        self._index = index
        self._nvml: Any = None
        self._handle: Any = None
        self._opened = False

    def _open(self) -> None:
        self._opened = True
        try:
            import pynvml  # type: ignore[import-not-found]
            import torch

            pynvml.nvmlInit()
            index = self._index
            if index is None:
                index = torch.cuda.current_device() if torch.cuda.is_available() else 0
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # no NVML, no driver, no permission: run without GPU state
            self._nvml = None

    @property
    def available(self) -> bool:
        if not self._opened:
            self._open()
        return self._nvml is not None

    def _reasons(self) -> int:
        nvml, handle = self._nvml, self._handle
        getter = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                  or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        return int(getter(handle))

    def sample(self) -> dict[str, Any] | None:
        """``{"sm_mhz", "power_w", "temp_c", "throttle": [...]}`` now, or None where NVML does not answer."""
        if not self.available:
            return None
        nvml, handle = self._nvml, self._handle
        try:
            return {
                "sm_mhz": int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                "power_w": round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),
                "temp_c": int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                "throttle": throttle_words(self._reasons()),
            }
        except Exception:
            return None
