"""`--set` overrides that shrink recipes/tiny.yaml to a few steps of every stage: what a test needs
when it runs the whole pipeline (or a benchmark's whole chain) for where its figures come from, not
for their size."""

SHORT = [
    "tokenizer.vocab_size=1024", "data.world.stdlib_files=20", "data.world.facts=600", "data.world.arithmetic=400",
    "data.world.retrieval=30", "data.world.noisy=100",
    "stages.pretrain.tokens=8192", "stages.pretrain.global_batch=4", "stages.pretrain.micro_batch=4",
    "stages.pretrain.checkpoint_every_tokens=4096", "stages.pretrain.schedule.warmup_tokens=1024",
    "stages.pretrain.val_tokens=2048",
    "stages.merge.windows_tokens=[8192]", "stages.merge.val_tokens=2048",
    "stages.long_context.tokens=8192", "stages.long_context.data.lengths=[{length: 512, share: 1.0}]",
    "stages.long_context.data.global_batch_tokens=4096", "stages.long_context.data.micro_batch_tokens=4096",
    "stages.long_context.data.doc_qa={documents: 20, max_paragraphs: 8}", "stages.long_context.needle_lengths=[256]",
    "stages.long_context.needle_per_length=2",
    "stages.sft.data.world.per_domain=30", "stages.sft.data.world.long_context=4", "stages.sft.data.heldout_limit=4",
    "stages.sft.eval_suite=null", "stages.sft.stages[0].tokens=4096", "stages.sft.stages[0].gate=null",
    "stages.sft.stages[0].schedule.warmup_tokens=0", "stages.sft.stages[1].tokens=16384",
    "stages.rl.steps=2", "stages.rl.prompts_per_step=2", "stages.rl.rollout.group_size=2",
    "stages.rl.rollout.max_new_tokens=4", "stages.rl.filter=null", "stages.rl.data.heldout_limit=4",
    "stages.rl.data.heldout_samples=1", "stages.rl.data.world.per_domain=40",
    "stages.distill.steps=2", "stages.distill.prompts_per_step=2", "stages.distill.rollout.group_size=2",
    "stages.distill.rollout.max_new_tokens=4", "stages.distill.eval_suite=null",
    "stages.distill.teachers=[{name: arithmetic, domains: [arithmetic, format], stage: rl}]",
    "stages.distill.checkpoint_every_steps=null",
    "stages.quantize.calib_batches=1", "stages.quantize.score_batches=1", "stages.quantize.batch_size=1",
    "stages.quantize.seq_length=64", "stages.quantize.val_tokens=1024", "stages.quantize.heldout_limit=2",
    "stages.quantize.eval_suite=null",
]
"""Every stage of tiny.yaml, each a few steps (~2 minutes in process on 2 cores)."""
