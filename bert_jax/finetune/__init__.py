"""Fine-tuning: task readers, official metrics, task losses and the fine-tuning job."""
