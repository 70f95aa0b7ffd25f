# evaluate the base gpt2-medium on OpenWebText (train and val loss)
# n_layer=24, n_head=16, n_embd=1024 - 350M parameters
# $ python train.py config/eval_gpt2_medium.py
batch_size = 8
eval_iters = 500  # use more iterations to get good estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-medium'
