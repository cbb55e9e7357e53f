"""Model builders with PyTorch-style parameter names (state_dict keys of the reference
implementation), random initialisation where no weights are given."""
