"""DinoVision: the flagship demo (a 3D scene, a DINOv2 backbone, on-device training)."""
