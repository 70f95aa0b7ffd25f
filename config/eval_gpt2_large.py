# evaluate the base gpt2-large on OpenWebText (train and val loss)
# n_layer=36, n_head=20, n_embd=1280 - 774M parameters
# $ python train.py config/eval_gpt2_large.py
batch_size = 8
eval_iters = 500  # use more iterations to get good estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-large'
