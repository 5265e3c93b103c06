"""Learning-rate schedulers with PyTorch's names and rate sequences (call ``step()`` once per
epoch or batch, after the optimizer's). Each computes the rate at step ``last_epoch`` in closed
form from the groups' initial rates, so loading a state restores the rate exactly."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

from onemodel.tensors import OneModelError

from .optimizer import Optimizer


class LRScheduler:
    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = 0
        self._apply()

    def lr_at(self, base_lr: float, epoch: int) -> float:
        raise NotImplementedError

    def lrs_at(self, epoch: int) -> list[float]:
        """Every group's rate at step ``epoch``."""
        return [self.lr_at(base, epoch) for base in self.base_lrs]

    def _apply(self) -> None:
        for g, lr in zip(self.optimizer.param_groups, self.lrs_at(self.last_epoch)):
            g["lr"] = lr

    def step(self) -> None:
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict) -> None:
        self.last_epoch = int(state["last_epoch"])
        self.base_lrs = list(state["base_lrs"])
        self._apply()


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """Cosine from the initial rate down to ``eta_min`` over ``T_max`` epochs."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LambdaLR(LRScheduler):
    """The initial rate times ``lr_lambda(epoch)``."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.lr_lambda(epoch)


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` at each epoch in ``milestones`` (a milestone
    listed twice multiplies twice)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
        self.milestones, self.gamma = sorted(int(m) for m in milestones), gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float):
        self.gamma = gamma
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma**epoch


class LinearLR(LRScheduler):
    """Scale the rate from ``start_factor`` to ``end_factor`` linearly over ``total_iters``
    steps, then hold it (the usual warm-up)."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise OneModelError(f"LinearLR: start_factor must lie in (0, 1] and end_factor in "
                                f"[0, 1], got {start_factor} and {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer)

    def lr_at(self, base_lr, epoch):
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                          * min(self.total_iters, epoch) / self.total_iters)


class SequentialLR(LRScheduler):
    """Run ``schedulers[i]`` from ``milestones[i-1]`` on, each restarted at its own step 0."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int]):
        schedulers = list(schedulers)
        if not schedulers:
            raise OneModelError("SequentialLR needs at least one scheduler")
        if len(milestones) != len(schedulers) - 1:
            raise OneModelError(f"SequentialLR: {len(schedulers)} schedulers need "
                                f"{len(schedulers) - 1} milestones, got {len(milestones)}")
        for i, sch in enumerate(schedulers):
            if not isinstance(sch, LRScheduler) or isinstance(sch, SequentialLR):
                raise OneModelError(f"SequentialLR: scheduler {i} is a {type(sch).__name__}; it "
                                    f"takes the closed-form schedulers (not ReduceLROnPlateau)")
            if sch.optimizer is not optimizer:
                raise OneModelError(f"SequentialLR: scheduler {i} drives another optimizer")
        self.schedulers, self.milestones = schedulers, [int(m) for m in milestones]
        super().__init__(optimizer)

    def lrs_at(self, epoch):
        idx = bisect_right(self.milestones, epoch)
        start = self.milestones[idx - 1] if idx else 0
        sch = self.schedulers[idx]
        sch.last_epoch = epoch - start
        return sch.lrs_at(epoch - start)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "_schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        for sch, st in zip(self.schedulers, state.get("_schedulers", [])):
            sch.last_epoch, sch.base_lrs = int(st["last_epoch"]), list(st["base_lrs"])
        super().load_state_dict(state)


class OneCycleLR(LRScheduler):
    """The one-cycle policy (Smith 2018): rate up from ``max_lr / div_factor`` to ``max_lr`` over
    ``pct_start`` of ``total_steps``, then down to ``initial / final_div_factor``; momentum (or
    Adam's beta1) cycles the opposite way. Step it once per batch."""

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float],
                 total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | Sequence[float] = 0.85,
                 max_momentum: float | Sequence[float] = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False):
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise OneModelError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
            total_steps = int(epochs) * int(steps_per_epoch)
        if total_steps <= 0:
            raise OneModelError(f"OneCycleLR: total_steps must be positive, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise OneModelError(f"OneCycleLR: pct_start must lie in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise OneModelError(f"OneCycleLR: anneal_strategy is 'cos' or 'linear', "
                                f"got {anneal_strategy!r}")
        self.total_steps, self.anneal_strategy = int(total_steps), anneal_strategy
        n = total_steps
        if three_phase:
            self.phases = [
                (float(pct_start * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct_start * n) - 2, "max_lr", "initial_lr", "base_momentum",
                 "max_momentum"),
                (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self.phases = [
                (float(pct_start * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        groups = optimizer.param_groups

        def per_group(name, v):
            vs = list(v) if isinstance(v, (list, tuple)) else [v] * len(groups)
            if len(vs) != len(groups):
                raise OneModelError(f"OneCycleLR: {name} has {len(vs)} values for "
                                    f"{len(groups)} parameter groups")
            return vs

        for g, m in zip(groups, per_group("max_lr", max_lr)):
            g["initial_lr"] = m / div_factor
            g["max_lr"] = m
            g["min_lr"] = g["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise OneModelError(f"OneCycleLR: {type(optimizer).__name__} has no momentum or "
                                    f"betas to cycle; pass cycle_momentum=False")
            self.use_beta1 = "betas" in optimizer.defaults
            for g, mx, base in zip(groups, per_group("max_momentum", max_momentum),
                                   per_group("base_momentum", base_momentum)):
                if self.use_beta1:
                    g["betas"] = (mx, *g["betas"][1:])
                else:
                    g["momentum"] = mx
                g["max_momentum"], g["base_momentum"] = mx, base
        super().__init__(optimizer)

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, group, epoch):
        if epoch > self.total_steps:
            raise OneModelError(f"OneCycleLR stepped {epoch} times; it was set up for "
                                f"total_steps={self.total_steps}")
        start = 0.0
        for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
            if epoch <= end or i == len(self.phases) - 1:
                pct = (epoch - start) / (end - start)
                mom = (self._anneal(group[m0], group[m1], pct) if self.cycle_momentum else None)
                return self._anneal(group[lr0], group[lr1], pct), mom
            start = end
        raise AssertionError("unreachable")

    def lrs_at(self, epoch):
        return [self._phase(g, epoch)[0] for g in self.optimizer.param_groups]

    def _apply(self) -> None:
        for g in self.optimizer.param_groups:
            g["lr"], mom = self._phase(g, self.last_epoch)
            if self.cycle_momentum:
                if self.use_beta1:
                    g["betas"] = (mom, *g["betas"][1:])
                else:
                    g["momentum"] = mom


class ReduceLROnPlateau:
    """Multiply the rate by ``factor`` once the metric passed to ``step(metric)`` has not
    improved for ``patience`` epochs (``mode='min'`` or ``'max'``, ``threshold`` relative or
    absolute), then wait ``cooldown`` epochs; never below ``min_lr``."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8):
        if factor >= 1.0:
            raise OneModelError(f"ReduceLROnPlateau: factor must be < 1, got {factor}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise OneModelError(f"ReduceLROnPlateau: mode is 'min' or 'max' and threshold_mode "
                                f"'rel' or 'abs', got {mode!r} and {threshold_mode!r}")
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise OneModelError(f"ReduceLROnPlateau: {len(min_lr)} min_lr values for "
                                    f"{n} parameter groups")
            self.min_lrs = [float(v) for v in min_lr]
        else:
            self.min_lrs = [float(min_lr)] * n
        self.optimizer, self.mode, self.factor, self.patience = optimizer, mode, factor, patience
        self.threshold, self.threshold_mode, self.cooldown, self.eps = (threshold, threshold_mode,
                                                                         cooldown, eps)
        self.last_epoch = 0
        self.best = math.inf if mode == "min" else -math.inf
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel"
                        else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel"
                    else best + self.threshold)

    def step(self, metrics: float) -> None:
        current = float(metrics)
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g, floor in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(g["lr"])
                new = max(old * self.factor, floor)
                if old - new > self.eps:
                    g["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    _STATE = ("last_epoch", "best", "cooldown_counter", "num_bad_epochs", "min_lrs", "mode",
              "factor", "patience", "threshold", "threshold_mode", "cooldown", "eps")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._STATE}

    def load_state_dict(self, state: dict) -> None:
        for k in self._STATE:
            if k in state:
                setattr(self, k, state[k])
