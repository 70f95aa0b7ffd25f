# evaluate the base gpt2-xl on OpenWebText (train and val loss)
# n_layer=48, n_head=25, n_embd=1600 - 1558M parameters
# $ python train.py config/eval_gpt2_xl.py
batch_size = 8
eval_iters = 500  # use more iterations to get good estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-xl'
