# Sourced by the bench/dflash_*_probe.sh CPU proxies: the one training setting they all share, so
# their grafts differ only in what each probe varies (a recipe field at apply, or the draw).
#   proxy_train RUN DATA.jsonl LOG   head-only graft training: backbone frozen, λ = 0, 300 steps x 8
#                                    of the first 800 responses, cached target features
# Needs PY (the Python to run).
proxy_train() {
  "$PY" -m domino_graft train "$1" train.backbone=frozen train.lambda_start=0.0 train.max_steps=300 \
      train.batch_size=8 train.data.path="$2" train.data.num_samples=800 \
      train.data.max_length=384 train.features=offline train.anchors_per_seq=32 train.lr=1e-3 \
      train.warmup_steps=10 train.save_every=100 --no-progress > "$3" 2>&1
}
