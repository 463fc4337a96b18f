"""The Megatron-Bridge release the translation (engines/megatron/translate.py) is written for.

Why a pin: the override text a plan hands run_recipe.py is only right for the release that builds
the config from it (its recipe functions, `--dataset` presets and override processing), and a team
installs a release, not the repository snapshot the translation was first read from (UPSTREAM_COMMIT
there). tests/engines/megatron/test_real_plans.py runs every plan the recipe check emits through
this release's own recipe functions, override processing and `ConfigContainer.validate()`; that is
how the LoRA text (`+peft.*`) and the typed packing specs were found. The engine check at launch
(engines/availability.py) refuses a launch environment with another release, since nothing has
checked that it accepts the plans (docs/DEPLOY.md, "Which Megatron-Bridge").
"""

MEGATRON_BRIDGE_RELEASE = "0.6.2"
"""The `megatron-bridge` distribution the plans are validated against (its PyPI version)."""

MEGATRON_CORE_RELEASE = "0.19.2"
"""The `megatron-core` the side environment validates with. megatron-bridge 0.6.2 requires
megatron-core without a version bound, so this is recorded (the side environment installs it), not
enforced at launch: a NeMo container ships the megatron-core its Megatron-Bridge was built with."""
