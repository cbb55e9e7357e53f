"""Model builders with PyTorch-style parameter names (state_dict keys of the reference
implementation), random initialisation where no weights are given."""


def config_from(cls, config):
    """A config dataclass `cls` from an instance of it, a dict, or a transformers config
    object (read by attribute); fields it lacks keep their defaults."""
    from dataclasses import fields

    if isinstance(config, cls):
        return config
    get = config.get if isinstance(config, dict) else (lambda k, d: getattr(config, k, d))
    return cls(**{f.name: get(f.name, f.default) for f in fields(cls)})


def param_source(builder, weights: dict, prefix: str = ""):
    """param(name, shape, init, frozen=False) -> a builder param named prefix + name: the
    given weight when `weights` has it (its shape checked against the config's), else
    init(shape)."""
    import numpy as np

    def param(name, shape, init, frozen=False):
        name = prefix + name
        value = weights.get(name)
        if value is None:
            value = init(shape)
        elif tuple(np.shape(value)) != tuple(shape):
            raise ValueError(f"{name}: weights give shape {np.shape(value)}, the config needs {tuple(shape)}")
        return builder.param(name, value, frozen=frozen)

    return param
