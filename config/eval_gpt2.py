# evaluate the base gpt2 on OpenWebText (train and val loss)
# n_layer=12, n_head=12, n_embd=768 - 124M parameters
# $ python train.py config/eval_gpt2.py
batch_size = 8
eval_iters = 500  # use more iterations to get good estimate
eval_only = True
wandb_log = False
init_from = 'gpt2'
