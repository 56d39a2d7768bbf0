"""The Pusher: component.py (ImagePusher: TFX's Pusher, the model card's files pushed beside the model)."""
