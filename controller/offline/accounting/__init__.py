"""offline/accounting"""
