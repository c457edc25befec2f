"""offline/models"""
