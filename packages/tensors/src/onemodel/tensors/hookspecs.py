"""The core hook specifications of the ``onemodel`` plugin system.

Every hook is a *registration* hook: it receives a ``register`` callback and calls it once per thing
the plugin provides. Code is named lazily as ``"module:attribute"`` strings, so discovering plugins
imports nothing heavy (numba, onnx, a GPU library); the code is imported when first used.

A minimal plugin is one module with one of these functions, decorated with
:data:`onemodel.tensors.registry.hookimpl`, plus an entry point in group ``onemodel``::

    [project.entry-points.onemodel]
    myplugin = "my_package.onemodel_plugin"
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("onemodel")


@hookspec(historic=True)
def onemodel_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add hook specifications of another package (the runtime adds its passes and serializers).

    :param pluginmanager: the ``onemodel`` plugin manager; call ``pluginmanager.add_hookspecs``.

    Example (what ``onemodel.runtime.plugin`` does)::

        @hookimpl
        def onemodel_addhooks(pluginmanager):
            from onemodel.runtime import hookspecs
            pluginmanager.add_hookspecs(hookspecs)
    """


@hookspec
def onemodel_register_backends(register) -> None:
    """Declare devices this plugin computes on (``onemodel.tensors.devices``).

    :param register: ``register(name, *, description="", available=None, array_module=None,
        to_device=None, to_host=None, synchronize=None, fallback=True)``. ``available`` is
        ``None`` (always usable) or a zero-argument callable returning a bool. ``to_device``
        takes a host numpy array and returns the device's array; ``to_host`` the reverse;
        ``synchronize`` waits for queued work. ``fallback=True`` lets ops without a kernel on
        this device run on the CPU with counted transfers; ``False`` makes them an error that
        names the op and the device. Every callable may be a lazily imported ``"module:attr"``.
        Kernels for the device are registered with ``onemodel_register_kernels`` and
        ``device=name``; they receive and return the device's arrays.

    Example (``integration-tests/backends/sim``)::

        @hookimpl
        def onemodel_register_backends(register):
            register("sim", description="host arrays in a wrapper type",
                     to_device="onemodel_sim.arrays:to_sim",
                     to_host="onemodel_sim.arrays:to_host")
    """


@hookspec
def onemodel_register_kernels(register) -> None:
    """Provide kernels for ops of the op set.

    :param register: ``register(op, impl, *, device="cpu", dtypes=None, priority=0, supports=None,
        writes_out=False)``. ``impl`` is a callable or a ``"module:attr"`` string naming one; it is
        called as ``impl(*arrays, **attrs)`` with numpy arrays and the op's attributes and returns
        an array (or a tuple for ops with several outputs). ``dtypes`` limits the kernel to calls
        whose first input has one of these DTypes. Among kernels that accept a call, the highest
        ``priority`` wins; the reference numpy kernels have priority 0. ``supports`` (same call
        signature as ``impl``, returns a bool) can refuse a particular call. ``writes_out``
        (single-output ops only) says the kernel also takes a keyword ``out=``: a C-contiguous array
        of exactly the output's shape and dtype that overlaps no input, which the kernel fills
        completely and returns. The planner then gives it a buffer reused from run to run.
        Two names outside the op set register optimizer updates that ``onemodel.training``'s
        optimizers look up: ``"optim.SGD"`` and ``"optim.Adam"`` (one parameter's whole step,
        in place; see ``onemodel.numba.optim`` for the signatures).

    Example (``plugins/_template``)::

        @hookimpl
        def onemodel_register_kernels(register):
            register("Relu", "example_kernels:relu", dtypes=["F32", "F64"], priority=10,
                     supports="example_kernels:relu_supports")
    """
