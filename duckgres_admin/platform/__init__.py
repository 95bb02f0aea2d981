"""The shared platform layer: what both domains and the faces use, above the base and below the
models and the external-system seams. The settings' strict parsing (``config``), the queue and
task names (``queues``) and the beat table (``beat``), the runner's name and milestone columns
(``names``), the advisory-lock keys (``lockkeys``) and the per-org lock (``orglock``), the leader
lease (``leadership``), PostgreSQL type names (``pgtypes``) and the process logging
(``logs``). The layers contract keeps it below the models, the seams and everything above them."""
