"""A kernel's SearchSpace as Optuna sees it: ordered values become ordinal indices.

Block sizes, warps and stages are ordered (64 lies between 32 and 128), so they are suggested as an
integer index into the value list: TPE, GP and CMA-ES can then model "bigger is better" instead of
treating 64 and 128 as unrelated labels. Flags and variant names stay categorical.
"""

from __future__ import annotations

import dataclasses

import optuna

from kernels import Config, DeviceInfo, Param, Problem, SearchSpace


def is_ordinal(param: Param) -> bool:
    # However few values narrowing leaves, an integer parameter stays an integer index: Optuna lets an
    # integer's range change between the trials of one study, but not its kind.
    return all(isinstance(v, int) and not isinstance(v, bool) for v in param.values)


def narrowed(space: SearchSpace, problem: Problem, device: DeviceInfo) -> SearchSpace:
    """``space`` with each ordinal parameter cut to the values that some valid config of ``problem`` has.

    A value no valid config has (BLOCK_M=32 for a 16-row problem, GROUP_SIZE_M=4 where one group
    covers the rows) can only draw invalid or folded samples. Live on the H100, one search of
    16x4096x4096 drew 67 invalid samples in 25 trials, and its sampler took 16 of its 25 s.
    Categorical parameters (VARIANT, flags) keep all their choices: Optuna refuses a categorical
    parameter whose choices differ between the trials of one study, and a study outlives a version.
    """
    seen: dict[str, set] = {p.name: set() for p in space.params}
    defaults = {p.name: p.default for p in space.params}
    for config in space.enumerate(problem, device):
        for name, values in seen.items():
            values.add(config.get(name, defaults[name]))  # a variant that ignores a defaulted parameter leaves it out
    if not seen[space.params[0].name]:
        return space  # nothing is valid; the search says so when it finds nothing to measure
    return dataclasses.replace(space, params=tuple(
        dataclasses.replace(p, values=tuple(v for v in p.values if v in seen[p.name])) if is_ordinal(p) else p
        for p in space.params))


def suggest_config(trial: optuna.Trial, space: SearchSpace) -> Config:
    """Sample one point of ``space`` (not yet canonical, not yet checked against constraints)."""
    values = {}
    for param in space.params:
        if is_ordinal(param):
            values[param.name] = param.values[trial.suggest_int(param.name, 0, len(param.values) - 1)]
        else:
            values[param.name] = trial.suggest_categorical(param.name, list(param.values))
    return Config.from_dict(values)


def params_of(config: Config, space: SearchSpace) -> dict[str, object]:
    """The Optuna parameters that make ``suggest_config`` return ``config`` (for enqueue_trial)."""
    values = config.as_dict()
    params: dict[str, object] = {}
    for param in space.params:
        value = values.get(param.name, param.default)  # a config stored before the parameter existed
        params[param.name] = param.values.index(value) if is_ordinal(param) else value
    return params


def config_of(params: dict[str, object], space: SearchSpace) -> Config:
    """Inverse of ``params_of``: a finished trial's parameters as a Config."""
    values = {}
    for param in space.params:
        if param.name not in params and param.default is not None:
            continue  # a trial made before the parameter existed: left out, as its configs leave it out
        raw = params[param.name]
        values[param.name] = param.values[int(raw)] if is_ordinal(param) else raw
    return Config.from_dict(values)


def distributions_of(space: SearchSpace) -> dict[str, optuna.distributions.BaseDistribution]:
    """The distributions ``suggest_config`` draws from: for trials made outside a sampler (add_trial)."""
    return {param.name: optuna.distributions.IntDistribution(0, len(param.values) - 1) if is_ordinal(param)
            else optuna.distributions.CategoricalDistribution(list(param.values)) for param in space.params}
