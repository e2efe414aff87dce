"""batch_assets/queue/limits"""
