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
