"""rlx runtime: config, RNG streams, controller, parameter server, model, inference, trainer, CLI."""
