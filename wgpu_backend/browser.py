"""The page's entry to the wgpu device in Pyodide, above both the backend and the browser driver
(the backend opens a BrowserDriver by default there, so the driver module cannot build backends):

    from tallow_wgpu.browser import create_browser_driver, register_device
    driver = await create_browser_driver()     # or BrowserDriver.open() with run_sync available
    dev = register_device(driver)              # tallow.Device("wgpu") now runs on the browser's GPU
"""
from tallow.device import use_backend

from .backend import WgpuBackend
from .driver_browser import BrowserDriver, create_browser_driver

__all__ = ["BrowserDriver", "create_browser_driver", "register_device"]


def register_device(driver, max_binding=None):
    """Make tallow.Device("wgpu") use `driver` (the wgpu backend picks the native driver by default).
    max_binding: assume storage bindings of at most this many bytes (tests of the splitting).
    Returns that Device."""
    return use_backend("wgpu", WgpuBackend(driver, max_binding=max_binding))
